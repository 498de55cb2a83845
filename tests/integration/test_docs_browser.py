"""The documentation site in a real browser (Debian's Chromium, headless): every page of the
navigation renders its title, its code blocks and its images, and the search finds the page
that tells how to roll back."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.docs import nav_entries, page_path
from tests.support.servers import free_port, serving

REPO = Path(__file__).parents[2]
WAIT_SECONDS = 20


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Keep the test's output to its failures."""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site, built strictly and served on 127.0.0.1: its base URL."""
    folder = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)]
    subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium and chromedriver are missing: scripts/_browser.sh installs them")
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium-driver)")
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.binary_location = chromium
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    chrome.set_page_load_timeout(WAIT_SECONDS)
    try:
        yield chrome
    finally:
        chrome.quit()


def title_of(page: str) -> str:
    """The page's first heading as the browser shows it (no backticks or emphasis)."""
    first = next(line for line in (REPO / "docs" / page).read_text().splitlines() if line)
    assert first.startswith("# "), f"{page} does not open with its title"
    return re.sub(r"[`*]", "", first[2:]).strip()


def fences(page: str) -> int:
    return sum(line.startswith("```") for line in (REPO / "docs" / page).read_text().splitlines())


def directives(page: str) -> int:
    """The objects a page documents from their docstrings (``::: name``)."""
    return sum(line.startswith("::: ") for line in (REPO / "docs" / page).read_text().splitlines())


@pytest.mark.parametrize(("title", "page"), nav_entries())
def test_every_page_renders_its_title_code_and_images(
    site: str, browser: WebDriver, title: str, page: str
) -> None:
    browser.get(site + page_path(page))
    heading = browser.find_element(By.CSS_SELECTOR, "article h1")
    assert heading.text.strip() == title_of(page)
    assert browser.title == ("pyspark-abs" if page == "index.md" else f"{title} - pyspark-abs")
    blocks = browser.find_elements(By.CSS_SELECTOR, "article div.highlight pre code")
    written, generated = fences(page) // 2, directives(page)
    if generated:  # mkdocstrings shows each object's signature, and its members'
        assert len(blocks) >= written + generated, f"{page}: code blocks shown"
    else:
        assert len(blocks) == written, f"{page}: code blocks shown"
    assert all(block.text.strip() for block in blocks), f"{page}: an empty code block"
    images = browser.find_elements(By.CSS_SELECTOR, "article img")
    loaded = [img.get_attribute("src") for img in images if img.get_property("naturalWidth")]
    assert len(loaded) == len(images), f"{page}: images that did not load"


def test_the_search_finds_the_page_that_tells_how_to_roll_back(
    site: str, browser: WebDriver
) -> None:
    browser.get(site)
    browser.find_element(By.CSS_SELECTOR, "label[for=__search]").click()
    browser.find_element(By.CSS_SELECTOR, "input[data-md-component=search-query]").send_keys(
        "rollback"
    )
    WebDriverWait(browser, WAIT_SECONDS).until(
        lambda b: b.find_elements(By.CSS_SELECTOR, ".md-search-result__item")
    )
    found = [
        a.get_attribute("href") or ""
        for a in browser.find_elements(By.CSS_SELECTOR, ".md-search-result__item a")
    ]
    assert any("/guide/savepoints/" in href for href in found), found


def test_scripts_docs_serves_the_site_locally(tmp_path: Path) -> None:
    port = free_port()
    command = [str(REPO / "scripts" / "docs"), "--dev-addr", f"127.0.0.1:{port}"]
    with serving(command, port, tmp_path / "docs.log", start_seconds=120):
        url = f"http://127.0.0.1:{port}/guide/savepoints/"
        with urllib.request.urlopen(url, timeout=WAIT_SECONDS) as response:
            page = response.read().decode()
    assert re.search(r"<h1[^>]*>Savepoints: roll back, restore, rescale, edit state", page)

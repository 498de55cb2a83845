# Sourced by scripts/test after scripts/_env.sh. The documentation's browser test drives
# Debian's Chromium through chromedriver: install both when they are missing and this
# machine lets us (root with apt-get, as in CI); elsewhere the test is skipped, except under
# CI=true, where it fails.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing chromium and chromium-driver for the documentation's browser test" >&2
        if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            chromium chromium-driver) >"$VENV/apt-chromium.log" 2>&1; then
            cat "$VENV/apt-chromium.log" >&2
            echo "could not install chromium (above): the browser test will fail" >&2
        fi
    else
        echo "no chromium and chromedriver: the documentation's browser test is skipped" >&2
    fi
fi

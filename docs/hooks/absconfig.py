"""An mkdocs hook: the configuration page's table of ``AbsConfig``'s fields.

It is generated from the class (its fields, defaults and the ``Attributes`` of its
docstring), so the page cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pyspark_abs.config import CODE_ONLY, AbsConfig, spark_conf_key

MARKER = "<!-- AbsConfig fields -->"
MIB = 1024 * 1024


def attribute_docs(docstring: str) -> dict[str, str]:
    """The ``Attributes:`` section of a Google-style docstring, name to text.

    Each text is on one line, with reStructuredText's double backticks as Markdown's single ones.
    """
    section = docstring.split("Attributes:", 1)[1]
    docs: dict[str, str] = {}
    name = ""
    for line in section.splitlines():
        entry = re.match(r"^ {8}(\w+): (.*)$", line)
        if entry:
            name = entry.group(1)
            docs[name] = entry.group(2)
        elif line.startswith(" " * 12) and name:
            docs[name] += " " + line.strip()
        elif line.strip():
            break
    return {k: v.replace("``", "`") for k, v in docs.items()}


def shown_default(field: dataclasses.Field[Any]) -> str:
    """A field's default as the table shows it (sizes in MiB)."""
    value = field.default_factory() if callable(field.default_factory) else field.default
    if isinstance(value, int) and not isinstance(value, bool) and value >= MIB and not value % MIB:
        return f"{value // MIB} MiB"
    return f"`{value!r}`".replace("'", '"')


def fields_table() -> str:
    """The Markdown table of every field: its Spark conf key, default and meaning.

    Raises:
        ValueError: A field has no entry under ``Attributes:`` in the class's docstring.
    """
    docs = attribute_docs(AbsConfig.__doc__ or "")
    rows = ["| field | Spark conf | default | meaning |", "| --- | --- | --- | --- |"]
    for field in dataclasses.fields(AbsConfig):
        if field.name not in docs:
            raise ValueError(f"AbsConfig.{field.name} has no entry under Attributes: document it")
        conf = "(code only)" if field.name in CODE_ONLY else f"`{spark_conf_key(field.name)}`"
        rows.append(f"| `{field.name}` | {conf} | {shown_default(field)} | {docs[field.name]} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **_: object) -> str:
    """Put the table where a page holds :data:`MARKER`."""
    return markdown.replace(MARKER, fields_table()) if MARKER in markdown else markdown

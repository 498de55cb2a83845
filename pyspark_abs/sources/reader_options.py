"""Checks of the options a source passes on to one of Spark's own readers."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark_abs.errors import ConfigError


def require_text_options(options: object, source: str) -> None:
    """Refuse reader options that are not a mapping of text to text.

    Raises:
        ConfigError: Naming ``source`` and the options given.
    """
    if not isinstance(options, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in options.items()
    ):
        raise ConfigError(
            f"{source}: options must be a dict of text to text (as Spark's reader options), "
            f"got {options!r}"
        )

"""The layout of a snapshot root."""

from __future__ import annotations

BACKEDGE_PREFIX = "backedge/"
"""Table ids of back-edge logs start with this."""

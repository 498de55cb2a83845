"""The ``_manifest`` table: its entries, the epoch log folded from them, opening it."""

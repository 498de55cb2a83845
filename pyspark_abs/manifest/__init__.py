"""The manifest layer: the entries of the ``_manifest`` table, the epoch log and the table."""

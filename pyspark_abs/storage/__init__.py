"""Delta tables and files, and the layout of a snapshot root."""

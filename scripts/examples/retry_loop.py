"""A retry loop with bounded attempts and a dead-letter table, run until quiescent.

    python scripts/examples/retry_loop.py --root DIR [--jobs 1000] [--max-attempts 3]

See pyspark_abs/examples/retry.py and docs/guide/cycles.md.
"""

import sys

from pyspark_abs.examples.retry import main

if __name__ == "__main__":
    sys.exit(main())

"""Streaming connected components over an edge file, run until quiescent (exit 0 if exact).

    python scripts/examples/connected_components.py --root DIR [--edges FILE.csv]

See pyspark_abs/examples/components.py and docs/guide/cycles.md.
"""

import sys

from pyspark_abs.examples.components import main

if __name__ == "__main__":
    sys.exit(main())

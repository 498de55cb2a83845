"""``python -m pyspark_abs``: the pyspark-abs command line (see :mod:`pyspark_abs.cli`)."""

import sys

from pyspark_abs.cli import main

sys.exit(main())

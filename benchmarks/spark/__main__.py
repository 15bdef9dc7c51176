"""``python -m benchmarks.spark``: the benchmark's command line (see ``--help``)."""

import sys

from benchmarks.spark.bench import main

sys.exit(main())

"""``python -m benchmarks.latency``: the benchmark's command line (see ``--help``)."""

import sys

from benchmarks.latency.bench import main

sys.exit(main())

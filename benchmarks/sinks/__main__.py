"""``python -m benchmarks.sinks``: the benchmark's command line (see ``--help``)."""

import sys

from benchmarks.sinks.bench import main

sys.exit(main())

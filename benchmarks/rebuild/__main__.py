"""``python -m benchmarks.rebuild``: the benchmark's command line (see ``--help``)."""

import sys

from benchmarks.rebuild.bench import main

sys.exit(main())

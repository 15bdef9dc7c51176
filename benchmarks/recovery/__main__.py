"""``python -m benchmarks.recovery``: the benchmark's command line (see ``--help``)."""

import sys

from benchmarks.recovery.bench import main

sys.exit(main())

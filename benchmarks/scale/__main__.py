"""``python -m benchmarks.scale``: the benchmark's command line (see ``--help``)."""

import sys

from benchmarks.scale.bench import main

sys.exit(main())

"""``python -m benchmarks.kafka``: the benchmark's command line (see ``--help``)."""

import sys

from benchmarks.kafka.bench import main

sys.exit(main())

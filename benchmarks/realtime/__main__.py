"""``python -m benchmarks.realtime``: see :mod:`benchmarks.realtime`."""

import sys

from benchmarks.realtime.run import main

sys.exit(main())

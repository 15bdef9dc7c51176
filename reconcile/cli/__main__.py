"""``python -m reconcile.cli``: the ``reconcile`` command."""

import sys

from reconcile.cli.command import main

sys.exit(main())

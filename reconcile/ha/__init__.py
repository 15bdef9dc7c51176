"""High availability: a main and hot standbys of one streaming pipeline, a lease, and takeover.

``HaNode`` runs a pipeline as ``main`` or ``standby``; ``open_lease`` gives
the leadership lease from the backend of the sink database (for PostgreSQL a
row in it); ``reconcile.ha.takeover`` is what a new leader does before its
stream starts.
"""

from reconcile.core.extras import require
from reconcile.core.lease import DEFAULT_TERM_S, Lease, LeaseState

# The takeover ends the old main's sessions in the sink database (psycopg).
require("psycopg", extra="postgres", what="reconcile.ha")

from reconcile.ha.leading import Role, Tenure  # noqa: E402
from reconcile.ha.lease import open_lease  # noqa: E402
from reconcile.ha.node import HaNode  # noqa: E402
from reconcile.ha.takeover import LeadershipLostError  # noqa: E402

__all__ = [
    "DEFAULT_TERM_S",
    "HaNode",
    "LeadershipLostError",
    "Lease",
    "LeaseState",
    "Role",
    "Tenure",
    "open_lease",
]

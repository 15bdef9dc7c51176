"""High availability: a main and hot standbys of one streaming pipeline, a lease, and takeover.

``HaNode`` runs a pipeline as ``main`` or ``standby``; ``PgLease`` is the
leadership lease (a row in the sink database); ``reconcile.ha.takeover`` is
what a new leader does before its stream starts.
"""

from reconcile.ha.leading import Role, Tenure
from reconcile.ha.lease import DEFAULT_TERM_S, LeaseState, PgLease
from reconcile.ha.node import HaNode
from reconcile.ha.takeover import LeadershipLostError

__all__ = [
    "DEFAULT_TERM_S",
    "HaNode",
    "LeadershipLostError",
    "LeaseState",
    "PgLease",
    "Role",
    "Tenure",
]

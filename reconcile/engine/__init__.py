"""The commit cycle and its driver: one epoch into every sink, exactly once, and the loop around it.

``cycle`` orders the steps (stage, record the expected state, prepare, commit,
finalize), ``steps`` runs each against every sink, ``restart`` settles what a
crash left, ``driver`` retries with backoff, ``expected`` adapts the
expected-state store to the cycle, ``progress_file`` is a progress log on
disk, and ``faults`` injects named failures for the tests and the demo.
"""

"""Chaos suite: fault injection at every step of the failure matrix."""

"""The engine on Spark: the Structured Streaming writer and the distributed verify/repair job.

Nothing here is imported by the core: a user who never touches Spark never starts a JVM.
"""

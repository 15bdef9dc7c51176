"""Test suite: unit (no services) and integration (real Postgres, Spark, Delta, HTTP)."""

"""Test suite: unit tests beside integration tests against real PostgreSQL, Spark and Delta."""

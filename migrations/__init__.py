"""Alembic migrations: the reference OLTP schema and the CDC bootstrap (publication and role)."""

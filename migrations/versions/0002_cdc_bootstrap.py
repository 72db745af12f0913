"""CDC bootstrap: the publication over the reference tables and a least-privilege capture role.

The role may log in, may open replication connections (``REPLICATION``) and may read the published
tables (``SELECT``) — what a consistent snapshot and logical decoding need, nothing more. Its name and
the publication's come from the Alembic config attributes ``cdc_role`` and ``cdc_publication``
(defaults ``cdc_reader`` and ``cdc_publication``); roles are cluster-wide, so creating it is idempotent.
The publication publishes partitioned tables through their root (``publish_via_partition_root``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from alembic import context, op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TABLES = ("customers", "categories", "products", "orders", "order_items")


def _names() -> tuple[str, str]:
    attributes = context.config.attributes
    return attributes.get("cdc_role", "cdc_reader"), attributes.get("cdc_publication", "cdc_publication")


def upgrade() -> None:
    role, publication = _names()
    op.execute(
        f"""
        DO $$
        BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN
                CREATE ROLE {role} LOGIN REPLICATION;
            END IF;
        END
        $$
        """
    )
    op.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
    op.execute(f"GRANT SELECT ON {', '.join(TABLES)} TO {role}")
    op.execute(f"CREATE PUBLICATION {publication} FOR TABLE {', '.join(TABLES)} WITH (publish_via_partition_root = true)")


def downgrade() -> None:
    role, publication = _names()
    op.execute(f"DROP PUBLICATION IF EXISTS {publication}")
    op.execute(f"REVOKE ALL ON {', '.join(TABLES)} FROM {role}")
    op.execute(f"REVOKE ALL ON SCHEMA public FROM {role}")

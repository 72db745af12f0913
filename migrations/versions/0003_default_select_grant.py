"""Tables created later in ``public`` are readable by the capture role as well.

A table added to the publication after capture started is snapshotted by capture, which needs SELECT on
it; default privileges grant that for every table the migrating role creates from now on.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

from alembic import context, op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _role() -> str:
    return str(context.config.attributes.get("cdc_role", "cdc_reader"))


def upgrade() -> None:
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {_role()}")


def downgrade() -> None:
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE SELECT ON TABLES FROM {_role()}")

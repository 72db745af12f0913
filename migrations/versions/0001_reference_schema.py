"""Reference OLTP schema shared by the demo, the tests and the benchmarks.

It exercises every type family the change events must carry faithfully: bigint/serial keys, a uuid key,
a composite key, numeric money amounts, timestamptz, jsonb, text[], an enum, and a long text column that
PostgreSQL stores out of line (TOAST).

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

REFERENCE_TABLES = ("customers", "categories", "products", "orders", "order_items")


def upgrade() -> None:
    op.execute("CREATE TYPE order_status AS ENUM ('pending', 'paid', 'shipped', 'cancelled')")
    op.execute(
        """
        CREATE TABLE customers (
            id          bigserial PRIMARY KEY,
            email       text NOT NULL UNIQUE,
            name        text NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE categories (
            id    serial PRIMARY KEY,
            name  text NOT NULL
        )
        """
    )
    op.execute(
        """
        CREATE TABLE products (
            id           bigserial PRIMARY KEY,
            category_id  integer REFERENCES categories (id),
            name         text NOT NULL,
            description  text,
            price        numeric(12, 2) NOT NULL,
            attributes   jsonb NOT NULL DEFAULT '{}'::jsonb,
            tags         text[] NOT NULL DEFAULT '{}',
            updated_at   timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE orders (
            id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
            customer_id  bigint NOT NULL REFERENCES customers (id),
            status       order_status NOT NULL DEFAULT 'pending',
            placed_at    timestamptz NOT NULL DEFAULT now(),
            total        numeric(14, 2) NOT NULL DEFAULT 0
        )
        """
    )
    op.execute(
        """
        CREATE TABLE order_items (
            order_id    uuid NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
            line_no     integer NOT NULL,
            product_id  bigint NOT NULL REFERENCES products (id),
            quantity    integer NOT NULL CHECK (quantity > 0),
            unit_price  numeric(12, 2) NOT NULL,
            PRIMARY KEY (order_id, line_no)
        )
        """
    )


def downgrade() -> None:
    for table in reversed(REFERENCE_TABLES):
        op.execute(f"DROP TABLE IF EXISTS {table}")
    op.execute("DROP TYPE IF EXISTS order_status")

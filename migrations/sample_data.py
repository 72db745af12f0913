"""Deterministic sample rows for the reference schema, shared by the demo, tests and benchmarks."""

from __future__ import annotations

import json
import random
from decimal import Decimal

import psycopg

CATEGORY_NAMES = ("books", "garden", "kitchen", "music", "toys")
WORDS = (
    "oak",
    "linen",
    "copper",
    "walnut",
    "steel",
    "wool",
    "glass",
    "cedar",
    "clay",
    "bamboo",
    "lamp",
    "chair",
    "kettle",
    "vase",
    "rug",
    "shelf",
    "bowl",
    "clock",
    "stool",
    "basket",
)


def insert_sample_data(url: str, *, customers: int = 20, products: int = 50, orders: int = 30, seed: int = 7) -> dict[str, int]:
    """Insert a small, reproducible data set; returns the number of rows written per table."""
    rng = random.Random(seed)
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO categories (name) VALUES (%s)", [(name,) for name in CATEGORY_NAMES])
        category_ids = [row[0] for row in cur.execute("SELECT id FROM categories ORDER BY id").fetchall()]
        cur.executemany(
            "INSERT INTO customers (email, name) VALUES (%s, %s)",
            [(f"customer{i}@example.com", f"Customer {i}") for i in range(customers)],
        )
        customer_ids = [row[0] for row in cur.execute("SELECT id FROM customers ORDER BY id").fetchall()]
        product_rows = []
        for i in range(products):
            name = f"{rng.choice(WORDS)} {rng.choice(WORDS)} {i}"
            description = " ".join(rng.choice(WORDS) for _ in range(40))
            price = Decimal(rng.randint(100, 99_999)) / 100
            attributes = json.dumps({"color": rng.choice(["red", "green", "blue"]), "weight_g": rng.randint(50, 5000)})
            tags = rng.sample(WORDS, 3)
            product_rows.append((rng.choice(category_ids), name, description, price, attributes, tags))
        cur.executemany(
            "INSERT INTO products (category_id, name, description, price, attributes, tags) "
            "VALUES (%s, %s, %s, %s, %s::jsonb, %s)",
            product_rows,
        )
        product_ids = [row[0] for row in cur.execute("SELECT id FROM products ORDER BY id").fetchall()]
        items = 0
        for _ in range(orders):
            order_id = cur.execute(
                "INSERT INTO orders (customer_id, status) VALUES (%s, %s) RETURNING id",
                (rng.choice(customer_ids), rng.choice(["pending", "paid", "shipped"])),
            ).fetchone()[0]  # type: ignore[index]
            lines = rng.randint(1, 4)
            for line_no in range(1, lines + 1):
                cur.execute(
                    "INSERT INTO order_items (order_id, line_no, product_id, quantity, unit_price) "
                    "SELECT %s, %s, id, %s, price FROM products WHERE id = %s",
                    (order_id, line_no, rng.randint(1, 5), rng.choice(product_ids)),
                )
            items += lines
        cur.execute(
            "UPDATE orders o SET total = s.total FROM ("
            " SELECT order_id, sum(quantity * unit_price) AS total FROM order_items GROUP BY order_id) s "
            "WHERE o.id = s.order_id"
        )
    return {
        "categories": len(CATEGORY_NAMES),
        "customers": customers,
        "products": products,
        "orders": orders,
        "order_items": items,
    }

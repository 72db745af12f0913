"""Shared fixtures live in ``fix_*.py`` plugins; this file only loads them."""

from __future__ import annotations

pytest_plugins = [
    "tests.fix_pg",
    "tests.fix_spark",
    "tests.fix_settings",
    "tests.fix_fs",
    "tests.fix_kafka",
    "tests.fix_spark_cluster",
]

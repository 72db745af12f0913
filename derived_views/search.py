"""search view (being written)."""

from __future__ import annotations

NAME = "search"


def sync(ctx, rng, *, replace=False):  # type: ignore[no-untyped-def]
    return []

"""Derived views kept exact from the change log: warehouse, search index and cache Delta tables."""

from __future__ import annotations

"""The views file: what the user defines of the views, validated before anything runs.

One TOML file (``CDC_VIEWS_FILE``, default ``views.toml`` in the working directory); a missing file
means the defaults: the warehouse keeps every captured table, with its history. ``views.example.toml``
at the repository root is a complete example. Today the file defines the warehouse::

    [warehouse]
    tables = ["public.orders", "public.order_items"]  # which captured tables (default: all of them)
    without_history = ["public.order_items"]          # tables that keep no history table

Names are ``schema.table`` exactly as the source spells them (no quoting: ``"Sales Q1".orders`` is
``Sales Q1.orders``).

Two checks, each raising one :class:`~derived_views.errors.ViewsFileError` that names the file, the
section and the key: :func:`load` checks the file's own shape (TOML syntax, known sections and keys,
value types, duplicates), :func:`check` checks it against the captured tables (every named table must
be captured). ``cdc setup`` and ``cdc sync`` run both before anything is written.
"""

from __future__ import annotations

import tomllib
from collections.abc import Collection
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from derived_views.errors import ViewsFileError


class WarehouseDefinition(BaseModel):
    """The ``[warehouse]`` section."""

    model_config = ConfigDict(extra="forbid")

    tables: list[str] | None = None
    """Captured tables the warehouse keeps (``schema.table``); ``None``: every captured table."""
    without_history: list[str] = []
    """Tables whose history (SCD 2) table is not kept."""

    @field_validator("tables", "without_history")
    @classmethod
    def _no_duplicates(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            seen: set[str] = set()
            for name in value:
                if "." not in name:
                    raise ValueError(f"{name!r} is not schema.table")
                if name in seen:
                    raise ValueError(f"{name!r} is listed twice")
                seen.add(name)
        return value

    def keeps(self, qualified: str) -> bool:
        """Whether the warehouse keeps the table ``schema.table``."""
        return self.tables is None or qualified in self.tables

    def keeps_history(self, qualified: str) -> bool:
        """Whether the warehouse keeps a history table of ``schema.table``."""
        return self.keeps(qualified) and qualified not in self.without_history


class ViewDefinitions(BaseModel):
    """The whole views file."""

    model_config = ConfigDict(extra="forbid")

    warehouse: WarehouseDefinition = WarehouseDefinition()
    source: str = "defaults (no views file)"
    """Where the definitions come from, for messages."""


def load(path: Path) -> ViewDefinitions:
    """The definitions in the views file at ``path`` (the defaults when there is no such file)."""
    if not path.exists():
        return ViewDefinitions()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ViewsFileError(f"{path}: not valid TOML: {exc}; fix the file or point CDC_VIEWS_FILE elsewhere") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ViewsFileError(f"{path}: cannot be read: {exc}") from None
    if "source" in data:
        raise ViewsFileError(f"{path}: [source] is not a section of the views file; known sections: [warehouse]")
    try:
        return ViewDefinitions.model_validate({**data, "source": str(path)})
    except ValidationError as exc:
        problem = exc.errors()[0]
        loc = problem["loc"]
        if problem["type"] == "extra_forbidden" and len(loc) == 1:
            raise ViewsFileError(f"{path}: [{loc[0]}] is not a section of the views file (known: [warehouse])") from None
        if problem["type"] == "extra_forbidden":
            raise ViewsFileError(f"{path}: {_location(loc)} is not a key of [{loc[0]}] (known: "
                                 f"{', '.join(_KEYS.get(str(loc[0]), ()))})") from None
        message = str(problem["msg"]).removeprefix("Value error, ")
        raise ViewsFileError(f"{path}: {_location(loc)}: {message}") from None


#: The keys of each section, for messages.
_KEYS = {"warehouse": tuple(WarehouseDefinition.model_fields)}


def _location(loc: tuple[object, ...]) -> str:
    """``[warehouse] tables[2]`` from pydantic's error location."""
    parts = [str(part) for part in loc]
    if not parts:
        return "the file"
    section, *rest = parts
    keys = "".join(f"[{p}]" if p.isdigit() else f" {p}" for p in rest)
    return f"[{section}]{keys}"


def check(definitions: ViewDefinitions, captured: Collection[str]) -> None:
    """Raise :class:`ViewsFileError` when ``definitions`` name a table that is not ``captured``."""
    warehouse = definitions.warehouse
    for key, names in (("tables", warehouse.tables or []), ("without_history", warehouse.without_history)):
        for name in names:
            if name not in captured:
                raise ViewsFileError(
                    f"{definitions.source}: [warehouse] {key}: {name} is not a captured table (captured: "
                    f"{', '.join(sorted(captured)) or 'none yet'}); name a table of the publication as schema.table, "
                    "or add it to the publication (and CDC_TABLES) first"
                )

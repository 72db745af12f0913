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

import re
import tomllib
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from derived_views.errors import ViewsFileError
from event_format.masks import Mask


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

    @property
    def keeps_any(self) -> bool:
        """Whether the warehouse keeps any table."""
        return self.tables is None or bool(self.tables)

    def keeps_history(self, qualified: str) -> bool:
        """Whether the warehouse keeps a history table of ``schema.table``."""
        return self.keeps(qualified) and qualified not in self.without_history


#: Names of indexes, entities, joins and children: they become view names, paths and JSON keys.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _plain_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"the name {name!r} must be letters, digits and _ (not starting with a digit): it becomes "
            "a view name, a directory and a JSON key"
        )
    return name


#: The name of an index, an entity, a join or a child.
Name = Annotated[str, AfterValidator(_plain_name)]


def _table_name(value: str) -> str:
    if "." not in value:
        raise ValueError(f"{value!r} is not schema.table")
    return value


#: ``schema.table`` as the source spells it.
TableName = Annotated[str, AfterValidator(_table_name)]
#: One column name or a list of them (a list of one for the single name).
ColumnNames = Annotated[list[str], BeforeValidator(lambda value: [value] if isinstance(value, str) else value)]


class JoinDefinition(BaseModel):
    """A many-to-one join (``[search.<index>.joins.<name>]``, ``[cache.<entity>.lookups.<name>]``): the
    row of ``table`` whose primary key equals ``on`` (columns of the root, or of the join named by
    ``from``), its ``columns`` contributed under the names given."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    table: TableName
    on: ColumnNames
    """The referencing column(s), in the order of the joined table's primary key."""
    from_: str | None = Field(default=None, alias="from")
    """The join whose table holds ``on`` (default: the root table): a chain of joins."""
    columns: dict[str, str]
    """Output name -> column of the joined table."""


class ChildDefinition(BaseModel):
    """One-to-many children nested as an array (``[cache.<entity>.children.<name>]``): the rows of
    ``table`` whose ``on`` column(s) equal the root's key, ordered by ``order_by``."""

    model_config = ConfigDict(extra="forbid")

    table: TableName
    on: ColumnNames
    """The child column(s) holding the root's key, in the order of the root's primary key."""
    order_by: ColumnNames | None = None
    """Column(s) the array is sorted by (default: the child table's primary key)."""
    columns: list[str] | None = None
    """The child's columns kept (default: all)."""


class SearchDefinition(BaseModel):
    """A search index (``[search.<index>]``): one document per row of ``root``."""

    model_config = ConfigDict(extra="forbid")

    root: TableName
    columns: list[str] | None = None
    """The root's columns kept in the document (default: all)."""
    joins: dict[Name, JoinDefinition] = {}
    text: list[str]
    """Document columns tokenized for ranking (text or arrays of text)."""
    stored: list[str] = []
    """Document columns shown with each result."""
    filter: str | None = None
    """A Spark SQL boolean over the document's columns: documents for which it is not true are left out."""

    @field_validator("text")
    @classmethod
    def _some_text(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("name at least one document column to tokenize")
        return value


class CacheDefinition(BaseModel):
    """A cache entity (``[cache.<entity>]``): one JSON value per row of ``root``, by its key."""

    model_config = ConfigDict(extra="forbid")

    root: TableName
    key: ColumnNames | None = None
    """The root's primary key (the default; any other column list is refused)."""
    columns: list[str] | None = None
    """The root's columns kept in the value (default: all)."""
    lookups: dict[Name, JoinDefinition] = {}
    children: dict[Name, ChildDefinition] = {}


class FixedMask(BaseModel):
    """``{ fixed = "<text>" }``: every non-null value becomes ``text``."""

    model_config = ConfigDict(extra="forbid")

    fixed: str


class TruncateMask(BaseModel):
    """``{ truncate = N }``: every non-null value becomes its first N characters."""

    model_config = ConfigDict(extra="forbid")

    truncate: int = Field(gt=0)


class CaptureRule(BaseModel):
    """What capture reads of one table (``[capture."<schema>.<table>"]``): its ``columns``, or every column
    but those it excludes (``exclude``), and the rows a SQL boolean ``where`` passes. ``cdc setup`` makes them the
    publication's column list and row filter (PostgreSQL 15 and later), which every read honours.

    ``mask`` names columns capture writes masked (:mod:`event_format.masks`): ``"hash"`` (HMAC-SHA256
    under ``CDC_MASK_KEY``), ``{ fixed = "..." }`` or ``{ truncate = N }``."""

    model_config = ConfigDict(extra="forbid")

    columns: list[str] | None = None
    exclude: list[str] | None = None
    where: str | None = None
    mask: dict[str, Literal["hash"] | FixedMask | TruncateMask] = {}

    def masks(self) -> dict[str, Mask]:
        """The declared masks by column."""
        return {
            column: Mask("hash")
            if rule == "hash"
            else Mask("fixed", text=rule.fixed)
            if isinstance(rule, FixedMask)
            else Mask("truncate", length=rule.truncate)  # type: ignore[union-attr]
            for column, rule in self.mask.items()
        }

    @field_validator("where")
    @classmethod
    def _some_filter(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("an empty filter: leave `where` out to capture every row")
        return value

    def model_post_init(self, _context: object) -> None:
        if self.columns is not None and self.exclude is not None:
            raise ValueError("give `columns` or `exclude`, not both")
        left_out = [c for c in self.mask if c in (self.exclude or ()) or (self.columns is not None and c not in self.columns)]
        if left_out:
            raise ValueError(
                f"`mask` names {', '.join(left_out)}, which the rule leaves out: a column is either left out or masked"
            )


class OutboxTable(BaseModel):
    """A table capture routes as an outbox (``[outbox."<schema>.<table>"]``), the way Debezium's Outbox
    Event Router does: each insert becomes one event in topic ``<CDC_TOPIC_PREFIX>.<CDC_OUTBOX_PREFIX>.<aggregate
    type>``, keyed by the aggregate id, its value the payload, headers ``id`` and ``type``; updates and
    deletes are not events, and the table itself is not copied to the log or the views
    (:mod:`cdc.capture.outbox_table`). Each key names the table's column that holds that part."""

    model_config = ConfigDict(extra="forbid")

    id: str = "id"
    aggregatetype: str = "aggregatetype"
    aggregateid: str = "aggregateid"
    type: str = "type"
    payload: str = "payload"


class ViewDefinitions(BaseModel):
    """The whole views file."""

    model_config = ConfigDict(extra="forbid")

    warehouse: WarehouseDefinition = WarehouseDefinition()
    search: dict[Name, SearchDefinition] = {}
    """Search indexes by name (view ``search.<name>``)."""
    cache: dict[Name, CacheDefinition] = {}
    """Cache entities by name (view ``cache.<name>``)."""
    capture: dict[TableName, CaptureRule] = {}
    """What capture reads of each table named (see :class:`CaptureRule`); a table not named is read whole."""
    outbox: dict[TableName, OutboxTable] = {}
    """Tables capture routes as outboxes (see :class:`OutboxTable`)."""
    source: str = "defaults (no views file)"
    """Where the definitions come from, for messages."""

    def view_names(self) -> list[str]:
        """Every view defined: ``warehouse``, ``search.<index>`` for each index, ``cache.<entity>`` for each entity."""
        return ["warehouse", *(f"search.{n}" for n in self.search), *(f"cache.{n}" for n in self.cache)]


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
        raise ViewsFileError(f"{path}: [source] is not a section of the views file (known: {_SECTIONS})")
    try:
        return ViewDefinitions.model_validate({**data, "source": str(path)})
    except ValidationError as exc:
        problem = exc.errors()[0]
        loc = tuple(problem["loc"])
        if problem["type"] == "extra_forbidden" and len(loc) == 1:
            raise ViewsFileError(f"{path}: [{loc[0]}] is not a section of the views file (known: {_SECTIONS})") from None
        if problem["type"] == "extra_forbidden":
            header, keys = _location(loc[:-1])
            where = f"[{header}{'.' + keys if keys else ''}]"
            raise ViewsFileError(
                f"{path}: {_shown(loc)} is not a key of {where} (known: {', '.join(_known_keys(loc[:-1]))})"
            ) from None
        message = str(problem["msg"]).removeprefix("Value error, ")
        raise ViewsFileError(f"{path}: {_shown(loc)}: {message}") from None


_SECTIONS = '[warehouse], [search.<index>], [cache.<entity>], [capture."<schema>.<table>"], [outbox."<schema>.<table>"]'


def _known_keys(loc: tuple[object, ...]) -> list[str]:
    """The keys the table at ``loc`` may hold, for messages."""
    models: dict[str, type[BaseModel]] = {
        "warehouse": WarehouseDefinition,
        "search": SearchDefinition,
        "cache": CacheDefinition,
        "capture": CaptureRule,
        "outbox": OutboxTable,
    }
    model = models.get(str(loc[0]), ViewDefinitions)
    if len(loc) >= 4:
        model = ChildDefinition if loc[2] == "children" else JoinDefinition
    return [info.alias or name for name, info in model.model_fields.items()]


def _location(loc: tuple[object, ...]) -> tuple[str, str]:
    """``("search.products", "joins.category.on")`` from pydantic's error location."""
    parts = [part for part in loc if part != "[key]"]  # a dict key that failed: the location names it already
    if not parts:
        return "", ""
    if parts[0] in ("search", "cache", "capture", "outbox") and len(parts) > 1:
        header, rest = f"{parts[0]}.{parts[1]}", parts[2:]
    else:
        header, rest = str(parts[0]), parts[1:]
    keys = ""
    for part in rest:
        keys += f"[{part}]" if isinstance(part, int) else (f".{part}" if keys else str(part))
    return header, keys


def _shown(loc: tuple[object, ...]) -> str:
    """``[warehouse] tables[2]``, ``[search.products] joins.category.on``."""
    header, keys = _location(loc)
    if not header:
        return "the file"
    return f"[{header}] {keys}" if keys else f"[{header}]"


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

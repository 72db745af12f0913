"""Reading several view tables as of one source commit: the Delta version of each that is exact as of it.

Each view table moves on by its own commits, so a report that reads the newest version of ``orders`` and
of ``order_items`` may see one further on than the other. :func:`versions_as_of` gives, for each table
asked for, the Delta version whose data equals the source as of one LSN (found from the tables' own
logs, :mod:`derived_views.engine.exact_versions`), to read with ``deltalake``
(``DeltaTable(path, version=v)``) or Spark (``.option("versionAsOf", v)``): the tables then agree with
each other and with the source as of that commit. No Spark is started.

An LSN is read as ``cdc wait`` reads it, as ``pg_current_wal_lsn()`` prints it after a commit: the
versions hold every transaction that committed before it, and no other. Without one (``latest``), it is
the newest LSN every table has reached. Guarantees, each with one :class:`~derived_views.errors.AsOfError`
when it cannot be kept:

- every version returned is exact as of the LSN (its data equals the source tables as of that commit,
  the view's transform applied), never a version merely near it;
- every version returned is kept readable by the retention (``CDC_VACUUM_RETENTION_HOURS``): it is its
  table's newest, or was replaced less than the retention ago. An LSN older than that, newer than what
  the views reached, or one that a sync step went past for some table (a step applies every transaction
  up to its watermark at once) is refused, the message naming the LSNs that can be read.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from derived_views.engine.exact_versions import Span, TableLog, at, common_at_or_above, common_at_or_below
from derived_views.errors import AsOfError, LsnFormatError
from derived_views.source.log_location import LogLocation

#: What stands for the newest LSN every table has reached.
LATEST = "latest"

_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
_TOP = (1 << 64) - 1


def lsn_text(lsn: int) -> str:
    """``lsn`` as PostgreSQL prints it (``0/16B3748``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str | int | None) -> int | None:
    """The LSN of ``text`` (PostgreSQL's ``0/16B3748`` form, or an integer); ``None`` for ``latest`` or no
    LSN. One :class:`~derived_views.errors.LsnFormatError` for anything else."""
    if text is None or isinstance(text, int):
        if isinstance(text, int) and not 0 < text <= _TOP:
            raise LsnFormatError(f"LSN {text} is outside 1..2**64-1")
        return text
    cleaned = text.strip()
    if cleaned.lower() == LATEST:
        return None
    match = _LSN.match(cleaned)
    if match is None or not (lsn := (int(match.group(1), 16) << 32) | int(match.group(2), 16)):
        raise LsnFormatError(f"{text!r} is not an LSN such as 0/16B3748 (as pg_current_wal_lsn() prints it) nor {LATEST!r}")
    return lsn


@dataclass(frozen=True)
class TableVersion:
    """One table's Delta version exact as of the LSN, and the positions that version is exact as of."""

    path: str
    version: int
    exact_from: int
    """The oldest position (commits at or before it) the version is exact as of."""
    exact_to: int
    """The newest position the version is known exact as of."""


@dataclass(frozen=True)
class VersionsAsOf:
    """The tables asked for, each at its version exact as of one LSN (see the module docstring)."""

    position: int
    """The source's state the versions equal: every transaction whose commit LSN is at or before it."""
    tables: dict[str, TableVersion]
    """By name: a table's path below the data directory (``warehouse/current/public.orders``)."""

    @property
    def lsn(self) -> str:
        """The LSN the versions are exact as of, as PostgreSQL prints it: they hold every commit before
        it (give it back to read the same versions again)."""
        return lsn_text(self.position + 1)

    @property
    def as_of(self) -> str:
        """The position the versions are as of, as ``cdc views`` shows a table's (``lsn`` minus one)."""
        return lsn_text(self.position)

    def path(self, name: str) -> str:
        """The path of the table ``name``."""
        return self.tables[name].path

    def version(self, name: str) -> int:
        """The Delta version of the table ``name`` to read."""
        return self.tables[name].version


class _Tables:
    """The spans of the tables asked for, read lazily."""

    def __init__(self, tables: Mapping[str, str], retention_hours: float, now_ms: int) -> None:
        self.retention_hours = retention_hours
        start = now_ms - int(retention_hours * 3600 * 1000)
        self.logs = {name: TableLog(path.removeprefix("file://"), start) for name, path in tables.items()}
        missing = [name for name, log in self.logs.items() if not log.exists()]
        unsynced = [name for name, log in self.logs.items() if name not in missing and log.reached() is None]
        if missing or unsynced:
            raise AsOfError(
                f"{', '.join(missing + unsynced)} {'has' if len(missing + unsynced) == 1 else 'have'} no version "
                "synced yet: run `cdc sync` first (`cdc views` lists every table)"
            )

    def spans_of(self, name: str, position: int) -> list[Span]:
        """The readable spans of the table ``name`` reaching down to ``position``."""
        return self.logs[name].readable_down_to(position)

    def reached(self) -> dict[str, int]:
        return {name: log.reached() or 0 for name, log in self.logs.items()}

    def newest(self) -> str:
        """The newest LSN every table has a readable version exact as of, for a message."""
        common = common_at_or_below(self.spans_of, self.logs, min(self.reached().values()))
        return "none" if common is None else lsn_text(common + 1)

    def retention(self) -> str:
        hours = f"{self.retention_hours:g}"
        return f"CDC_VACUUM_RETENTION_HOURS={hours} keeps versions replaced in the last {hours} h"


def select_versions(
    tables: Mapping[str, str], lsn: str | int | None = None, *, retention_hours: float = 168.0, now_ms: int | None = None
) -> VersionsAsOf:
    """The version of each table of ``tables`` (name -> Delta table path) exact as of ``lsn`` (see the
    module docstring; ``None`` or ``"latest"``: the newest LSN every table has reached), among the
    versions a retention of ``retention_hours`` keeps readable at ``now_ms`` (default: now)."""
    position = parse_lsn(lsn)
    if not tables:
        raise AsOfError("there is no view table to read: run `cdc capture` and `cdc sync` first")
    found = _Tables(tables, retention_hours, int(time.time() * 1000) if now_ms is None else now_ms)
    reached = found.reached()
    if position is None:
        common = common_at_or_below(found.spans_of, tables, min(reached.values()))
        if common is None:
            raise AsOfError(
                f"no LSN up to {lsn_text(min(reached.values()) + 1)} is one that every table has a readable version "
                f"exact as of ({found.retention()}); run `cdc sync` to bring every view to the log's latest watermark"
            )
        return _chosen(found, common)
    target = position - 1
    behind = {name: at for name, at in reached.items() if at < target}
    if behind:
        name = min(behind, key=lambda n: behind[n])
        raise AsOfError(
            f"LSN {lsn_text(position)} is newer than what the views have reached ({name} holds the commits before "
            f"{lsn_text(behind[name] + 1)}; the newest LSN every table is exact as of is {found.newest()}); wait for the "
            f"views with `cdc wait VIEW --lsn {lsn_text(position)}` (or run `cdc sync`), or read as of {LATEST!r}"
        )
    for name in tables:
        table_spans = found.spans_of(name, target)
        if at(table_spans, target) is not None:
            continue
        if not table_spans or table_spans[0].first > target:
            oldest = f"its oldest is exact from {lsn_text(table_spans[0].first + 1)}" if table_spans else "it has none"
            raise AsOfError(
                f"LSN {lsn_text(position)} is older than what the views keep readable ({found.retention()}; "
                f"{name} keeps no readable version exact as of it: {oldest}); read as of a later LSN, up to "
                f"{found.newest()} (`latest`), or keep versions longer with a larger CDC_VACUUM_RETENTION_HOURS"
            )
        before = max((s.last for s in table_spans if s.last < target), default=None)
        after = min((s.first for s in table_spans if s.first > target), default=None)
        below = common_at_or_below(found.spans_of, tables, target)
        above = common_at_or_above({n: found.spans_of(n, target) for n in tables}, target)
        nearest = " or ".join(lsn_text(p + 1) for p in (below, above) if p is not None) or "none"
        between = (
            f"its versions are exact as of LSNs up to {lsn_text(before + 1)} and from {lsn_text(after + 1)} on "
            "(one sync step applied what committed in between)"
            if before is not None and after is not None
            else "no step left it there"
        )
        raise AsOfError(
            f"no version of {name} is exact as of LSN {lsn_text(position)}: {between}; the nearest LSNs every "
            f"table has a version exact as of are {nearest} (read as of one of them, or {LATEST!r})"
        )
    return _chosen(found, target)


def _chosen(found: _Tables, position: int) -> VersionsAsOf:
    tables = {}
    for name, log in found.logs.items():
        span = at(log.readable_down_to(position), position)
        assert span is not None, (name, position)  # every table was found exact as of it
        tables[name] = TableVersion(log.path, span.version, span.first, span.last)
    return VersionsAsOf(position, tables)


def versions_as_of(
    data_dir: str | Path,
    lsn: str | int | None = None,
    tables: Iterable[str] | None = None,
    *,
    views_file: str | Path | None = None,
    log: str | LogLocation | None = None,
    prefix: str = "cdc",
    retention_hours: float = 168.0,
) -> VersionsAsOf:
    """The Delta version of each view table exact as of ``lsn`` (``pg_current_wal_lsn()``'s text form, or
    ``None``/``"latest"``: the newest LSN every table has reached), read without Spark.

    ``data_dir`` is ``CDC_DATA_DIR``. ``tables`` names the tables to read together by their path below it
    (``warehouse/current/public.orders``); by default every table of every view, as ``cdc views`` lists
    them: the views file ``views_file`` (``CDC_VIEWS_FILE``, default ``views.toml`` in the working
    directory) over the tables the log (``log``: its directory, default ``<data_dir>/log``, or a
    :class:`~derived_views.source.log_location.LogLocation`; ``prefix``: ``CDC_TOPIC_PREFIX``) holds.
    ``retention_hours`` is ``CDC_VACUUM_RETENTION_HOURS``. ``cdc views as-of`` prints the same mapping.
    """
    root = Path(data_dir).resolve()
    if tables is None:
        from derived_views.definitions import load
        from derived_views.runs.listing import captured_tables, view_tables

        definitions = load(Path(views_file) if views_file is not None else Path("views.toml"))
        captured = captured_tables(log if log is not None else str(root / "log"), prefix)
        listed = view_tables(root, captured, definitions)
        named = {str(Path(table.path).relative_to(root)): table.path for table in listed}
    else:
        named = {name.strip("/"): str(root / name.strip("/")) for name in tables}
    return select_versions(named, lsn, retention_hours=retention_hours)

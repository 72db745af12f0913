"""Errors the derived views raise; each names what is wrong and how to fix it.

The CLI prints ``str(error)`` as one line and exits with :attr:`ViewError.exit_code`, so every message
is complete on its own: the view, table, path or LSN involved, and the next step for the user.

Hierarchy::

    ViewError                 base; exit code 1
    ├── UnknownViewError      a view name that is not registered (exit code 2)
    ├── UnknownEntityError    ``cdc cache get`` / ``cdc search`` naming an entity or index not defined (exit code 2)
    ├── MissingTableError     a Delta table a command needs does not exist yet
    ├── LogUnavailableError   the log has no topic or no watermark to read up to
    ├── SourceSchemaError     the schema topic lacks a table a view needs
    ├── ViewBusyError         another process is syncing or rebuilding the same view
    ├── TablesFailedError     tables of a sync step failed (the others were applied)
    ├── ViewsFileError        the views file is malformed or names what is not captured (exit code 2)
    ├── DefinitionChangedError  a search index or cache entity needs a rebuild for its new definition
    ├── ColumnNameClashError  two source columns a Delta table would store under one name
    ├── AsOfError             no version of every table asked for is exact as of the LSN asked for (or readable)
    │   └── LsnFormatError    an LSN that is not one (exit code 2)
    └── VerifyMismatchError   ``cdc verify`` found differences (exit code 4)
"""

from __future__ import annotations


class ViewError(Exception):
    """Base of every view error the user can act on; ``exit_code`` is what the CLI exits with."""

    exit_code: int = 1


class UnknownViewError(ViewError):
    """A view name that is not one of the registered views."""

    exit_code = 2

    def __init__(self, name: str, known: list[str], source: str | None = None) -> None:
        defined = f" (as defined by {source})" if source else ""
        super().__init__(
            f"unknown view {name!r}: choose one of {', '.join(sorted(known))}{defined}; "
            "search indexes and cache entities are defined in the views file (CDC_VIEWS_FILE)"
        )
        self.name = name


class UnknownEntityError(ViewError):
    """An entity name the cache view does not serve."""

    exit_code = 2

    def __init__(self, name: str, known: list[str], kind: str = "cache entity") -> None:
        choices = f"choose one of {', '.join(sorted(known))}" if known else "none is defined"
        super().__init__(f"unknown {kind} {name!r}: {choices}; define it in the views file (CDC_VIEWS_FILE)")


class MissingTableError(ViewError):
    """A Delta table that a command reads has not been created yet."""

    def __init__(self, path: str, view: str) -> None:
        super().__init__(f"Delta table {path} does not exist: run `cdc sync {view} --once` first")
        self.path = path


class EarlierLayoutError(ViewError):
    """A view table a command reads was written in the layout of an earlier version; the next sync rewrites it."""

    def __init__(self, path: str, view: str) -> None:
        super().__init__(f"{path} has the layout an earlier version wrote: run `cdc sync {view} --once` to rewrite it")
        self.path = path


class LogUnavailableError(ViewError):
    """The log holds nothing a view can read (no watermark yet, or a missing topic)."""


class SourceSchemaError(ViewError):
    """The schema topic has no column list for a source table a view needs."""


class ViewBusyError(ViewError):
    """Another process holds the sync lock of a view."""

    def __init__(self, view: str, lock_path: str, pid: int | None) -> None:
        holder = f"process {pid}" if pid is not None else "another process"
        super().__init__(
            f"view {view!r} is being synced or rebuilt by {holder} (lock {lock_path}): only one "
            "`cdc sync`/`cdc rebuild` may write a view at a time; wait for it to finish or stop it, then retry"
        )
        self.view = view


class VerifyMismatchError(ViewError):
    """``cdc verify`` found rows that differ between a view and the source tables."""

    exit_code = 4


class TablesFailedError(ViewError):
    """Tables of a sync step failed to apply their batch; every other table was applied.

    Each failed table stays exact as of the watermark it last recorded and is retried by the next
    sync; ``cdc lag`` lists it until then (:mod:`derived_views.write.failures`).
    """

    def __init__(self, lines: list[str]) -> None:
        super().__init__(f"{len(lines)} table(s) failed, the others were applied: " + " | ".join(lines))
        self.lines = lines


class ViewsFileError(ViewError):
    """The views file (``CDC_VIEWS_FILE``) is malformed or names a table that is not captured; the
    message names the file, the section and the key."""

    exit_code = 2


class DefinitionChangedError(ViewError):
    """A search index or cache entity was built with another definition than the views file holds now."""

    def __init__(self, view: str, path: str) -> None:
        super().__init__(
            f"view {view}: its definition in the views file changed since {path} was built; run "
            f"`cdc rebuild {view}` to rebuild it from the log with the new definition (it is left as it was until then)"
        )
        self.view = view


class ColumnNameClashError(ViewError):
    """Two columns of one table that a Delta table cannot tell apart under any of their stored forms
    (:mod:`derived_views.events.column_names`): ``A`` beside ``a`` and a column called ``%41``."""

    def __init__(self, table: str, first: str, second: str, stored: str) -> None:
        where = f" of {table}" if table else ""
        super().__init__(
            f"columns {first!r} and {second!r}{where} would both be stored as {stored!r} in Delta, which compares "
            f"names without case (a name holding one of ' ,;{{}}()=', a tab or a newline, or with a case-only "
            f"twin, is stored percent-encoded, and no such form of {second!r} is free); rename one of them in the source"
        )


class AsOfError(ViewError):
    """Reading view tables as of one LSN cannot be done: a bad LSN, a table not synced yet, an LSN past
    what the views reached or older than what the retention keeps readable, or one no step left every
    table exact as of (:mod:`derived_views.runs.as_of_reads`); the message says which LSNs can be read."""


class LsnFormatError(AsOfError):
    """An LSN given in another form than ``pg_current_wal_lsn()`` prints (or ``latest``)."""

    exit_code = 2


class SparkServerUnreachableError(ViewError):
    """``CDC_SPARK_REMOTE`` names a Spark Connect server that does not answer."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"no Spark Connect server answers at {url} (CDC_SPARK_REMOTE): {reason}; start one with "
            f"`cdc spark-server`, or unset CDC_SPARK_REMOTE to run Spark in this process"
        )
        self.url = url


class SparkJarsMissingError(ViewError):
    """A view job started by ``spark-submit`` without Delta Lake's jars on the driver's classpath."""

    exit_code = 2

    def __init__(self, packages: str) -> None:
        super().__init__(
            "Delta Lake is not on the Spark driver's classpath: give spark-submit "
            f"`--packages {packages}`, or `--jars` with the jar files set-up fetched "
            '(`--jars "$(python -m derived_views.engine.spark_jars | paste -sd,)"`)'
        )

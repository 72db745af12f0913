"""Tables that failed to apply their batch: recorded beside the views so that ``cdc lag`` shows them.

One table's failure never stops the other tables of a sync step (a bad batch of one source table
must not freeze every view): the step applies everything else, then reports the failures and exits
non-zero (``--once``) or keeps going and retries the table at the next step (``--continuous``). The
failed table stays exactly as of the watermark it last recorded (its batch commits nothing), so no
promise gives way; it only falls behind, and this record says why.

File: ``<views dir>/_failures/<view>.json``, ``{"<table>": {"error": ..., "at": ..., "watermark": ...}}``,
replaced whole (written beside and renamed) at each change, removed when the view has no failure left.
Only a local views directory keeps the record (``cdc lag`` reads it without Spark); on object storage
the failures are in the sync's exit status and log lines.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

_DIR = "_failures"
_MESSAGE_CHARS = 400


@dataclass(frozen=True)
class TableFailure:
    """One table whose batch failed: the error (one line), when, and the watermark it was applied to."""

    view: str
    table: str
    error: str
    at: str = ""
    watermark: str = ""

    def line(self) -> str:
        """The failure as one line for logs and ``cdc lag``."""
        return (
            f"view {self.view}: table {self.table} failed to apply up to watermark {self.watermark} "
            f"({self.error}); it stays as of its last sync while the other tables move on"
        )


def summary(error: BaseException) -> str:
    """One line of an error: a Spark/JVM error's own message, without its stack trace."""
    java = getattr(error, "java_exception", None)
    text = str(java.toString()) if java is not None else str(error)  # type: ignore[union-attr]
    first = next(
        (line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("at ")), type(error).__name__
    )
    return first[:_MESSAGE_CHARS]


def _local(views_dir: str) -> Path | None:
    if "://" in views_dir and not views_dir.startswith("file://"):
        return None
    return Path(views_dir.removeprefix("file://")) / _DIR


def _file(views_dir: str, view: str) -> Path | None:
    directory = _local(views_dir)
    return directory / f"{view}.json" if directory is not None else None


def read(views_dir: str | Path, view: str) -> dict[str, dict[str, str]]:
    """The recorded failures of ``view`` by table (empty when none)."""
    path = _file(str(views_dir), view)
    if path is None or not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_all(views_dir: str | Path) -> list[TableFailure]:
    """Every recorded failure of every view."""
    directory = _local(str(views_dir))
    if directory is None or not directory.is_dir():
        return []
    out = []
    for path in sorted(directory.glob("*.json")):
        for table, info in sorted(read(views_dir, path.stem).items()):
            out.append(
                TableFailure(
                    path.stem, table, str(info.get("error", "")), str(info.get("at", "")), str(info.get("watermark", ""))
                )
            )
    return out


def record(views_dir: str, view: str, failed: dict[str, TableFailure]) -> None:
    """Record this step's ``failed`` tables of ``view``, replacing what earlier steps recorded: a step
    brings every table of the view to its watermark, so a table it does not name has caught up."""
    path = _file(views_dir, view)
    if path is None:
        return
    if not failed:
        path.unlink(missing_ok=True)
        return
    now = datetime.now(UTC).isoformat(timespec="seconds")
    current = {table: {"error": failure.error, "at": now, "watermark": failure.watermark} for table, failure in failed.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
        json.dump(current, handle, sort_keys=True)
    os.replace(handle.name, path)

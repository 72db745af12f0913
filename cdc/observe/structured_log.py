"""Structured log lines: one line per event, ``key=value`` pairs or one JSON object, never a password.

Call :func:`configure` once per process (the CLI does, from ``CDC_LOG_FORMAT``); then use the standard
:mod:`logging` API with ``extra={"fields": {...}}`` for the event's fields::

    log.info("appended", extra={"fields": {"events": 1000, "lsn": "0/16B3748"}})

prints ``ts=2026-11-21T06:00:00.123Z level=info logger=cdc.capture event=appended events=1000
lsn=0/16B3748``. Every rendered line passes through :func:`cdc.config.redact.redact_url`, so a connection URL
logged by any module (ours or a library's) shows ``***`` in place of its password.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

from cdc.config.redact import redact_url

_RESERVED = ("ts", "level", "logger", "event")


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "ts": _timestamp(record),
        "level": record.levelname.lower(),
        "logger": record.name,
        "event": record.getMessage(),
    }
    extra = getattr(record, "fields", None)
    if isinstance(extra, dict):
        fields.update({key if key not in _RESERVED else f"field_{key}": value for key, value in extra.items()})
    if record.exc_info and record.exc_info[1] is not None:
        error = record.exc_info[1]
        fields["error"] = f"{type(error).__name__}: {error}"
    return fields


def _kv_value(value: Any) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    if text == "" or any(ch in text for ch in ' "=\n\t'):
        return orjson.dumps(text).decode()
    return text


class KeyValueFormatter(logging.Formatter):
    """``key=value`` pairs, values quoted as JSON strings when they hold spaces, quotes or ``=``."""

    def format(self, record: logging.LogRecord) -> str:
        line = " ".join(f"{key}={_kv_value(value)}" for key, value in _fields(record).items())
        return redact_url(line)


class JsonFormatter(logging.Formatter):
    """One compact JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_url(orjson.dumps(_fields(record), default=str).decode())


def configure(log_format: str = "kv", level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Route every logger of the process to one handler on ``stream`` (stderr) in ``log_format``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else KeyValueFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("py4j", "alembic.runtime.migration", "alembic.runtime.plugins"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

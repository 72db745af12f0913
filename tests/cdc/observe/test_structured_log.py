"""Passwords never reach a log line or a message; structured log lines are parseable."""

from __future__ import annotations

import io
import logging

import orjson
import pytest

from cdc.config.redact import redact_url
from cdc.observe import structured_log


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://app:s3cret@db:5432/shop", "postgresql://app:***@db:5432/shop"),
        ("could not connect to postgres://u:p%40ss@h/x: refused", "could not connect to postgres://u:***@h/x: refused"),
        ("host=db password=s3cret user=app", "host=db password=*** user=app"),
        ("password='with space' dbname=x", "password=*** dbname=x"),
        ('{"url": "postgresql://a:b@c/d"}', '{"url": "postgresql://a:***@c/d"}'),
        ("postgresql://app@db/shop", "postgresql://app@db/shop"),
        ("postgresql://app:p@ss@db:5432/shop", "postgresql://app:***@db:5432/shop"),
        ("url postgresql://app:a@b@c@db/shop and mail x@y", "url postgresql://app:***@db/shop and mail x@y"),
        ("'postgresql://a:b@c'", "'postgresql://a:***@c'"),
        # CDC_DATABASE_PASSWORD(_FILE) joins the URL as its password parameter, percent-encoded
        (
            "postgresql://u@h/db?sslmode=verify-full&password=p%40ss%20w&x=1",
            "postgresql://u@h/db?sslmode=verify-full&password=***&x=1",
        ),
    ],
)
def test_redact_url(text: str, expected: str) -> None:
    assert redact_url(text) == expected


def _emit(log_format: str) -> str:
    stream = io.StringIO()
    structured_log.configure(log_format, stream=stream)
    logger = logging.getLogger("cdc.test")
    logger.info("connected", extra={"fields": {"url": "postgresql://app:s3cret@db/shop", "events": 3}})
    logger.warning("retrying password=hunter2")
    return stream.getvalue()


def test_key_value_lines() -> None:
    lines = _emit("kv").splitlines()
    assert len(lines) == 2
    assert "level=info logger=cdc.test event=connected url=postgresql://app:***@db/shop events=3" in lines[0]
    assert 'event="retrying password=***"' in lines[1]
    assert "s3cret" not in "".join(lines) and "hunter2" not in "".join(lines)


def test_json_lines() -> None:
    records = [orjson.loads(line) for line in _emit("json").splitlines()]
    assert records[0]["event"] == "connected"
    assert records[0]["url"] == "postgresql://app:***@db/shop"
    assert records[0]["events"] == 3
    assert records[1]["event"] == "retrying password=***"
    assert {"ts", "level", "logger"} <= set(records[1])

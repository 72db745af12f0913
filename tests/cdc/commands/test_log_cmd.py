"""``cdc log``: topics, describe, tail (also --follow in a real process) and compact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from cdc.cli import run
from cdc.commands.log_cmd import log_group, render_bytes
from log_store import LogConfig, LogStore, ProducerRecord
from log_store.segment import FILE_HEADER_SIZE
from tests.log_store.helpers import rec

REPO = Path(__file__).parents[3]


@pytest.fixture()
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CDC_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CDC_SEGMENT_BYTES", "1024")
    with LogStore.open(tmp_path / "log", LogConfig(segment_bytes=1024), writer=True) as log:
        log.ensure_topic("cdc.public.users", 2)
        log.ensure_topic("events", 1, compacted=False)
        for g in range(12):
            log.append_group(
                [rec("cdc.public.users", f'{{"id":{i}}}', f'{{"after":{{"id":{i},"g":{g}}}}}', ts=1000 + g) for i in range(4)],
                f"{g:016X}",
            )
        log.append_group([rec("events", None, "plain text"), ProducerRecord("events", b"k", b"\xed\xb3\xbf", 0)], "FF")
    return tmp_path


def _lines(output: str) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in output.splitlines()]


def test_topics(data_dir: Path) -> None:
    result = CliRunner().invoke(log_group, ["topics"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["cdc.public.users", "events"]


def test_describe(data_dir: Path) -> None:
    result = CliRunner().invoke(log_group, ["describe", "cdc.public.users"])
    assert result.exit_code == 0, result.output
    assert "2 partition(s), compacted" in result.output
    assert "dirty ratio" in result.output and "1.00" in result.output
    assert "latest watermark: #13 at position FF (" in result.output


def test_tail_from_beginning(data_dir: Path) -> None:
    result = CliRunner().invoke(log_group, ["tail", "cdc.public.users", "--from-beginning"])
    assert result.exit_code == 0, result.output
    lines = _lines(result.output)
    assert len(lines) == 48
    assert set(lines[0]) == {"topic", "partition", "offset", "key", "value", "timestamp"}
    assert lines[0]["topic"] == "cdc.public.users" and isinstance(lines[0]["key"], dict)
    last = {orjson.dumps(line["key"]): line["value"] for line in lines}
    assert {v["after"]["g"] for v in last.values()} == {11}  # type: ignore[index]


def test_tail_partition_and_limits(data_dir: Path) -> None:
    runner = CliRunner()
    one = _lines(
        runner.invoke(log_group, ["tail", "cdc.public.users", "--from-beginning", "-p", "1", "--max-records", "3"]).output
    )
    assert [line["partition"] for line in one] == [1, 1, 1]
    assert [line["offset"] for line in one] == [0, 1, 2]
    assert runner.invoke(log_group, ["tail", "cdc.public.users"]).output == ""  # starts at the end
    events = _lines(runner.invoke(log_group, ["tail", "events", "--from-beginning"]).output)
    assert [e["value"] for e in events] == ["plain text", {"base64": "7bO/"}]


def test_render_bytes() -> None:
    assert render_bytes(None) is None
    assert render_bytes(b'{"a":[1,2]}') == {"a": [1, 2]}
    assert render_bytes(b"12") == 12
    assert render_bytes(b"text") == "text"
    assert render_bytes(b"\xff") == {"base64": "/w=="}


def test_compact(data_dir: Path) -> None:
    result = CliRunner().invoke(log_group, ["compact", "cdc.public.users"])
    assert result.exit_code == 0, result.output
    assert "cdc.public.users[0]:" in result.output and "kept" in result.output
    rolled = CliRunner().invoke(log_group, ["compact", "--roll"])
    assert rolled.exit_code == 0, rolled.output
    tail = _lines(CliRunner().invoke(log_group, ["tail", "cdc.public.users", "--from-beginning"]).output)
    assert len(tail) == 4
    assert {line["value"]["after"]["g"] for line in tail} == {11}  # type: ignore[index]


def test_errors_are_one_line(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(log_group, ["describe", "nope"]) == 1
    assert run(log_group, ["tail", "events", "-p", "3"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"error: topic 'nope' does not exist in the log at {data_dir / 'log'}: run `cdc log topics` to list them",
        "error: partition 3 of topic 'events' does not exist (it has 1): use a partition from 0 to 0",
    ]


def test_compact_roll_needs_the_writer(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with LogStore.open(data_dir / "log", writer=True):
        assert run(log_group, ["compact", "--roll"]) == 1
    assert f"process {os.getpid()}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("stop_signal", "start_ignoring_sigint"),
    [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["sigint", "sigint-ignored-at-start", "sigterm"],
)
def test_tail_follow_in_a_process(data_dir: Path, stop_signal: signal.Signals, start_ignoring_sigint: bool) -> None:
    """--follow ends with status 0 on SIGINT or SIGTERM, also when started with SIGINT ignored (as a
    non-interactive shell starts `cmd &`): Python then never turns SIGINT into KeyboardInterrupt itself."""
    env = {**os.environ, "CDC_DATA_DIR": str(data_dir)}
    code = "from cdc.commands.log_cmd import log_group; log_group(prog_name='cdc log')"
    # `trap '' INT` ignores SIGINT, and an ignored signal stays ignored across exec
    ignoring = ["sh", "-c", "trap '' INT; exec \"$@\"", "sh"] if start_ignoring_sigint else []
    args = ["tail", "cdc.public.users", "--follow", "--from-beginning", "--poll-interval", "0.05"]
    tail = subprocess.Popen(
        [*ignoring, sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert tail.stdout is not None
    try:
        for _ in range(48):  # what was there already; then the process is surely following
            assert orjson.loads(tail.stdout.readline())["topic"] == "cdc.public.users"
        with LogStore.open(data_dir / "log", LogConfig(segment_bytes=1024), writer=True) as log:
            for g in range(3):
                log.append_group([rec("cdc.public.users", f'{{"id":{g}}}', f'{{"new":{g}}}')], f"{100 + g:016X}")
                line = orjson.loads(tail.stdout.readline())
                assert line["value"] == {"new": g}
        tail.send_signal(stop_signal)
        assert tail.wait(timeout=30) == 0
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()


def _damage_first_segment(data_dir: Path) -> Path:
    """Flip one byte inside the first batch of partition 0's first segment; returns the segment's path."""
    segment = sorted((data_dir / "log" / "topics" / "cdc.public.users" / "0").glob("*.log"))[0]
    data = bytearray(segment.read_bytes())
    data[FILE_HEADER_SIZE + 60] ^= 0xFF
    segment.write_bytes(bytes(data))
    return segment


def test_describe_reports_a_corrupt_segment_as_tail_does(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    segment = _damage_first_segment(data_dir)
    assert run(log_group, ["describe", "cdc.public.users"]) == 4
    captured = capsys.readouterr()
    assert "corrupt at offset 0" in captured.out
    (error,) = captured.err.splitlines()
    assert error.startswith(f"error: corrupt segment {segment} at byte {FILE_HEADER_SIZE} (log offset 0): ")
    assert run(log_group, ["tail", "cdc.public.users", "--from-beginning"]) == 4
    (tail_error,) = capsys.readouterr().err.splitlines()
    assert tail_error == error
    # the message says how to rebuild the log, not just that it could be
    log_dir = data_dir / "log"
    assert error.endswith(
        f"to rebuild it: stop `cdc capture`, move {log_dir} aside, run `cdc capture` (with no "
        "log it recreates the slot and snapshots every published table into a new log), then "
        "run `cdc rebuild VIEW` for every view"
    )


def test_describe_of_a_whole_log_checks_every_partition(data_dir: Path) -> None:
    result = CliRunner().invoke(log_group, ["describe", "cdc.public.users"])
    assert result.exit_code == 0, result.output
    assert "check ┃" in result.output
    rows = [line for line in result.output.splitlines() if line.startswith("│")]
    assert [row.split("│")[-2].strip() for row in rows] == ["ok", "ok"]


@pytest.mark.parametrize("deleted", [("watermarks.log", "watermark.pub"), ("watermark.pub",)])
def test_tail_without_watermark_files_is_an_error(
    data_dir: Path, capsys: pytest.CaptureFixture[str], deleted: tuple[str, ...]
) -> None:
    for name in deleted:
        (data_dir / "log" / name).unlink()
    assert run(log_group, ["tail", "cdc.public.users", "--from-beginning"]) == 4
    captured = capsys.readouterr()
    assert captured.out == ""
    (error,) = captured.err.splitlines()
    missing = data_dir / "log" / deleted[0]
    assert error.startswith(f"error: the log's watermark file {missing} is missing; ")
    if len(deleted) == 2:
        assert "restore it from a backup, or rebuild the log from its source; to rebuild it: stop" in error
    else:
        assert "start capture" in error and "rebuild" not in error


def test_compact_prints_only_what_it_did(data_dir: Path) -> None:
    first = CliRunner().invoke(log_group, ["compact", "cdc.public.users"])
    assert first.exit_code == 0, first.output
    assert "segment(s) rewritten" in first.output
    again = CliRunner().invoke(log_group, ["compact", "cdc.public.users"])
    assert again.exit_code == 0, again.output
    lines = again.output.splitlines()
    assert lines and all(": unchanged (" in line for line in lines), again.output
    assert "-> 0 bytes" not in again.output

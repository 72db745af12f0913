"""``cdc log consume`` and ``cdc log groups`` as real processes: two groups read one topic independently,
one is killed with ``kill -9`` mid-way and started again: no record skipped, only uncommitted ones again."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import orjson

from cdc.config.settings import load_settings
from cdc.observe.lag import measure_log
from log_store import LogStore
from tests.cdc.helpers import CDC, wait_for
from tests.log_store.helpers import rec

TOPIC = "cdc.outbox.orders"
COUNT = 3000


def _env(data_dir: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("CDC_")}
    env["CDC_DATA_DIR"] = str(data_dir)
    return env


def _cdc(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CDC), "log", *args], env=_env(data_dir), capture_output=True, text=True, timeout=120)


def _writing_to_full_pipe(pid: int) -> bool:
    """Whether process ``pid`` waits in a write to a full pipe (Linux tells it in ``/proc``)."""
    return "pipe_write" in Path(f"/proc/{pid}/wchan").read_text()


def _groups(data_dir: Path) -> dict[tuple[str, int], dict[str, int]]:
    result = _cdc(data_dir, "groups", "--json")
    assert result.returncode == 0, result.stderr
    return {(line["group"], line["partition"]): line for line in map(orjson.loads, result.stdout.splitlines())}


def test_two_groups_one_killed_mid_way_skip_nothing(tmp_path: Path) -> None:
    with LogStore.open(tmp_path / "log", writer=True) as log:
        log.ensure_topic(TOPIC, 3, compacted=False)
        for group in range(10):  # ten source transactions of 300 events each
            records = [rec(TOPIC, f"agg-{i % 7}", f'{{"n":{group * 300 + i}}}') for i in range(300)]
            log.append_group(records, f"{group + 1:016X}")
    killed = subprocess.Popen(
        [str(CDC), "log", "consume", "--group", "a", "--batch", "50", TOPIC],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert killed.stdout is not None
    head = b"".join(killed.stdout.readline() for _ in range(700))
    # killed while it waits to print a batch (the pipe full again): that batch is part printed, not committed
    wait_for(lambda: _writing_to_full_pipe(killed.pid), what="a full pipe")
    killed.send_signal(signal.SIGKILL)
    killed.wait(30)
    lines = (head + killed.stdout.read()).split(b"\n")  # what it printed before it died
    killed.stdout.close()
    first = [orjson.loads(line) for line in lines[:-1]]  # the last one is cut short, or empty
    mid = _groups(tmp_path)
    committed = {partition: mid[("a", partition)]["committed"] for partition in range(3) if ("a", partition) in mid}
    assert 0 < sum(committed.values()) <= len(first) < COUNT and sum(line["lag"] for line in mid.values()) > 0
    (counted,) = measure_log(load_settings(data_dir=str(tmp_path))).groups  # `cdc lag` counts it too
    assert (counted.group, counted.topic, counted.lag) == ("a", TOPIC, COUNT - sum(committed.values()))
    # every record the killed consumer committed was printed by it
    printed = {(line["partition"], line["offset"]) for line in first}
    assert all((p, o) in printed for p, end in committed.items() for o in range(end))
    restarted = _cdc(tmp_path, "consume", "--group", "a", TOPIC)
    other = _cdc(tmp_path, "consume", "--group", "b", "--batch", "999", TOPIC)
    assert restarted.returncode == other.returncode == 0, restarted.stderr + other.stderr
    second = [orjson.loads(line) for line in restarted.stdout.splitlines()]
    # the restart begins exactly at the committed offsets: nothing skipped, only uncommitted records again
    starts = {}
    for line in second:
        starts.setdefault(line["partition"], line["offset"])
    assert all(start == committed.get(partition, 0) for partition, start in starts.items())
    seen = {(line["partition"], line["offset"]) for line in first + second}
    assert len(seen) == COUNT and len(second) == COUNT - sum(committed.values())
    everything = [orjson.loads(line) for line in other.stdout.splitlines()]
    assert sorted(line["value"]["n"] for line in everything) == list(range(COUNT))  # the other group: all, once
    for partition in range(3):  # in offset order per partition
        offsets = [line["offset"] for line in everything if line["partition"] == partition]
        assert offsets == list(range(len(offsets)))
    after = _groups(tmp_path)
    assert {key: line["lag"] for key, line in after.items()} == {(g, p): 0 for g in "ab" for p in range(3)}
    assert [(g.group, g.lag) for g in measure_log(load_settings(data_dir=str(tmp_path))).groups] == [("a", 0), ("b", 0)]
    assert _cdc(tmp_path, "consume", "--group", "a", TOPIC).stdout == ""  # caught up: nothing again

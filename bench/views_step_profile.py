"""Where one sync step's wall time goes, from Spark's own event log: jobs, stages, tasks, and the rest.

Usage: python -m bench.views_step_profile [--conf KEY=VALUE]... [VIEW...]
(CDC_* settings as for ``cdc sync``; default: all views; ``--conf`` adds a Spark setting, to measure a knob)

Runs one ``cdc sync --once`` step in this process with Spark's event log on, then reads the log and
prints, beside the step's wall time (its anchor, measured in the same run):

- the time at least one Spark job was running (the union of job intervals), and the rest of the wall
  time: driver work between jobs (query analysis and planning, Delta's commit protocol and snapshot
  reads, py4j calls, Python);
- jobs, stages and tasks, task time split into executor run time, deserialization and scheduler delay;
- the SQL executions (a MERGE, a Delta read, a write) by description, with their count and time.

Prints figures only; it asserts nothing.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _union(intervals: list[tuple[int, int]]) -> int:
    """Milliseconds covered by at least one of ``intervals``."""
    covered, end = 0, -1
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        covered += stop - max(start, end)
        end = stop
    return covered


def event_log_spark(app_name: str, conf: dict[str, str]) -> tuple[SparkSession, Path]:
    """A view session with ``conf`` that writes Spark's event log (uncompressed) into a new directory:
    read it with :func:`events` after ``spark.stop()``, which flushes it."""
    from derived_views.engine.spark_session import build_spark

    directory = Path(tempfile.mkdtemp(prefix="cdc-eventlog-"))
    settings = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(directory), "spark.eventLog.compress": "false"}
    return build_spark(app_name, conf={**conf, **settings}), directory


def conf_and_words(arguments: list[str]) -> tuple[dict[str, str], list[str]]:
    """``--conf KEY=VALUE`` pairs of a bench's command line, and its other words."""
    conf = dict(arguments[i + 1].split("=", 1) for i, word in enumerate(arguments) if word == "--conf")
    words = [word for i, word in enumerate(arguments) if word != "--conf" and (i == 0 or arguments[i - 1] != "--conf")]
    return conf, words


def events(directory: Path) -> list[dict[str, Any]]:
    """Every event of the run (Spark 4 writes a directory of rolled files, ``events_<n>_<app>``)."""
    files = sorted((p for p in directory.rglob("events_*") if p.is_file()), key=lambda p: int(p.name.split("_")[1]))
    return [json.loads(line) for path in files for line in path.read_text().splitlines() if line.strip()]


def summarize(events: list[dict[str, Any]], wall_s: float) -> list[str]:
    """The report's lines."""
    job_start: dict[int, int] = {}
    jobs: list[tuple[int, int]] = []
    stages = tasks = 0
    run_ms = deserialize_ms = delay_ms = 0
    sql_start: dict[int, tuple[int, str]] = {}
    sql: dict[str, list[int]] = defaultdict(list)
    for event in events:
        kind = event.get("Event", "")
        if kind == "SparkListenerJobStart":
            job_start[event["Job ID"]] = event["Submission Time"]
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in job_start:
            jobs.append((job_start[event["Job ID"]], event["Completion Time"]))
        elif kind == "SparkListenerStageCompleted":
            stages += 1
        elif kind == "SparkListenerTaskEnd":
            tasks += 1
            info, metrics = event["Task Info"], event.get("Task Metrics") or {}
            run, deserialize = metrics.get("Executor Run Time", 0), metrics.get("Executor Deserialize Time", 0)
            run_ms += run
            deserialize_ms += deserialize
            delay_ms += max(
                0, info["Finish Time"] - info["Launch Time"] - run - deserialize - metrics.get("Result Serialization Time", 0)
            )
        elif kind.endswith("SparkListenerSQLExecutionStart"):
            description = (event.get("description") or "").splitlines()[0][:60] or "(no description)"
            sql_start[event["executionId"]] = (event["time"], description)
        elif kind.endswith("SparkListenerSQLExecutionEnd") and event["executionId"] in sql_start:
            started, description = sql_start[event["executionId"]]
            sql[description].append(event["time"] - started)
    busy = _union(jobs) / 1000
    lines = [
        f"step wall time                         {wall_s:8.2f} s   (anchor)",
        f"some Spark job running                 {busy:8.2f} s   ({busy / wall_s:.0%} of the step)",
        f"no job running (driver, Delta, py4j)   {wall_s - busy:8.2f} s   ({(wall_s - busy) / wall_s:.0%})",
        f"jobs / stages / tasks                  {len(jobs)} / {stages} / {tasks}",
        f"task time: run / deserialize / delay   {run_ms / 1000:.2f} / {deserialize_ms / 1000:.2f} / {delay_ms / 1000:.2f} s",
        "SQL executions by description (count, total s, longest s):",
    ]
    for description, durations in sorted(sql.items(), key=lambda item: -sum(item[1]))[:15]:
        lines.append(f"  {len(durations):4d} {sum(durations) / 1000:8.2f} {max(durations) / 1000:8.2f}  {description}")
    return lines


def main(views: list[str], conf: dict[str, str]) -> None:
    from cdc.config import view_arguments
    from cdc.config.settings import load_settings
    from derived_views.definitions import load
    from derived_views.runs import runner

    settings = load_settings()
    spark, directory = event_log_spark("cdc-profile", conf)
    ctx = view_arguments.context_from_settings(settings, spark)
    names = runner.resolve(views, load(settings.views_file))
    started = time.monotonic()
    report = runner.step(ctx, names)
    wall = time.monotonic() - started
    print(f"synced {', '.join(f'{name}: {count} events' for name, count in report.events.items())}")
    spark.stop()  # flushes the event log
    for line in summarize(events(directory), wall):
        print(line)


if __name__ == "__main__":
    settings, chosen = conf_and_words(sys.argv[1:])
    main(chosen, settings)

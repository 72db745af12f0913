"""Fan-out of one joined row in a search index: re-index its documents only, beside a full recompute.

Usage: python -m bench.views_fanout [--roots N] [--others N] [--dir DIR] [--deletion-vectors]
(default 1,000,000 roots; ``--deletion-vectors``: the opt-in layout, ``CDC_DELETION_VECTORS=true``)

A log is written by hand (the capture side's batch path: Arrow columns per 100,000 events, no Python
object per event) with the snapshot of ``public.products`` (id bigint, category_id int, name text,
description text: 16 words from a 2,000-word vocabulary) and ``public.categories`` (id, name), plus an
unrelated ``public.customers``. Category 1 is referenced by exactly 1% of the products (every id divisible
by 100); the others spread over ``--others`` categories (default 1,000). One search index joins them:
``text = name, description, category_name``. Then, one source transaction at a time, each followed by
one incremental ``cdc sync`` step of the index (:func:`derived_views.runs.runner.step`):

- an update of ``public.customers`` (a table the index does not read): the floor of a step;
- a rename of a category no product references: the index's machinery runs, no document changes;
- a rename of category 1, twice (the first MERGE of the process runs on a cold JVM, the second warm):
  exactly 1% of the documents must be re-computed.

The anchor is a full recompute of the index in the same run: ``cdc rebuild`` of the view (``replace``:
its state copies replayed from the log, then every document and its terms overwritten), timed once
after the steps above (the initial build, on an empty index, is printed too). Documents rewritten are
read from the documents table's own commits (``DESCRIBE HISTORY``: a MERGE's updated + inserted +
deleted rows, an overwrite's rows written), and so are the terms rows; each MERGE's line also shows
the unchanged rows it copied into new files (Delta's copy-on-write: by default the view tables have no
deletion vectors), the files it replaced, and its scan and rewrite times. Each step is split into phases (state
copies, affected roots, documents, terms, the rest) by timing the functions :mod:`derived_views.views.search`
calls. Prints figures, asserts nothing about time; other load on the machine moves them a lot.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.capture_common import timed
from bench.views_common import delta_commits
from log_store import LogStore, ProducerColumns, ProducerRecord

PREFIX = "cdc"
PARTITIONS = 3  # capture's default (CDC_PARTITIONS)
BLOCK = 100_000  # events per Arrow block
HOT = 1  # the category 1% of the products reference
UNUSED = 0  # a category no product references
DESCRIPTION_WORDS = 16
VOCABULARY = 2_000
VIEW = "search.products"
BASE_TS_MS = 1_763_700_000_000


def _col(name: str, type_name: str, key: bool = False) -> dict[str, Any]:
    return {"name": name, "type": type_name, "oid": 0, "typmod": -1, "key": key, "nullable": not key}


TABLES = {
    "products": [_col("id", "int8", True), _col("category_id", "int4"), _col("name", "text"), _col("description", "text")],
    "categories": [_col("id", "int4", True), _col("name", "text")],
    "customers": [_col("id", "int8", True), _col("name", "text")],
}

VIEWS = {
    "search": {
        "products": {
            "root": "public.products",
            "text": ["name", "description", "category_name"],
            "stored": ["name", "category_name"],
            "joins": {"category": {"table": "public.categories", "on": "category_id", "columns": {"category_name": "name"}}},
        }
    }
}


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _words() -> pa.Array:
    """``VOCABULARY`` distinct lower-case words of two or three syllables."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = [a + b for a in syllables for b in syllables]
    words += [a + b + c for a in syllables[:20] for b in syllables for c in syllables[:10]]
    return pa.array(words[:VOCABULARY], pa.string())


class LogWriter:
    """Writes the log: envelopes as ``docs/event-format.md`` specifies, one append group per transaction."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lsn = 0x1000
        with self._open() as log:
            log.ensure_topic(f"{PREFIX}.__schemas", 1)
            for table in TABLES:
                log.ensure_topic(self.topic(table), PARTITIONS)

    def _open(self) -> LogStore:
        return LogStore.open(self.root, writer=True)

    @staticmethod
    def topic(table: str) -> str:
        return f"{PREFIX}.public.{table}"

    def _source(self, table: str, sequence: int | str, snapshot: str) -> str:
        return (
            f'"source":{{"connector":"postgresql","db":"bench","lsn":{self.lsn},"name":"{PREFIX}",'
            f'"schema":"public","sequence":{sequence},"snapshot":"{snapshot}","table":"{table}",'
            f'"ts_ms":{BASE_TS_MS + self.lsn},"txId":{self.lsn // 16}}}'
        )

    def snapshot(self, roots: int, others: int) -> None:
        """The initial snapshot of every table, in one group."""
        words = _words()

        def blocks() -> Iterator[ProducerRecord | ProducerColumns]:
            for table, columns in TABLES.items():
                value = {"schema": "public", "table": table, "topic": self.topic(table), "columns": columns, "lsn": self.lsn}
                yield ProducerRecord(f"{PREFIX}.__schemas", _canonical(f"public.{table}"), _canonical(value), BASE_TS_MS)
            names = [(UNUSED, "unused category"), (HOT, "hot category")] + [(i, f"category {i}") for i in range(2, others + 2)]
            yield ProducerColumns(
                self.topic("categories"),
                pa.array([_canonical({"id": i}) for i, _ in names], pa.binary()),
                pa.array(
                    [self._envelope("categories", "r", {"id": i, "name": n}, seq) for seq, (i, n) in enumerate(names)],
                    pa.binary(),
                ),
                BASE_TS_MS + self.lsn,
            )
            yield ProducerColumns(
                self.topic("customers"),
                pa.array([_canonical({"id": 1})], pa.binary()),
                pa.array([self._envelope("customers", "r", {"id": 1, "name": "Ada"}, others + 2)], pa.binary()),
                BASE_TS_MS + self.lsn,
            )
            for first in range(1, roots + 1, BLOCK):
                yield self._products(np.arange(first, min(first + BLOCK, roots + 1), dtype=np.int64), others, words)

        with self._open() as log:
            log.append_group(blocks(), "%016X" % self.lsn, chunk_records=1)

    def _products(self, ids: np.ndarray, others: int, words: pa.Array) -> ProducerColumns:
        """Snapshot reads of the products ``ids`` as Arrow columns (key and envelope built by Arrow compute)."""
        category = np.where(ids % 100 == 0, HOT, 2 + (ids * 7919) % others)
        id_text = pa.array(ids).cast(pa.string())

        def word(index: np.ndarray) -> pa.Array:
            return pc.take(words, pa.array(index % VOCABULARY))

        name = pc.binary_join_element_wise(word(ids), word(ids // VOCABULARY + 7 * ids), id_text, " ")
        description = pc.binary_join_element_wise(
            *[word(ids * (2 * i + 7919) + i * 104729 + (ids >> (i % 7))) for i in range(DESCRIPTION_WORDS)], " "
        )
        # each read's position in the snapshot transaction follows the categories' and the customer's
        sequence = pa.array(ids + others + 2).cast(pa.string())
        before, after = self._source("products", "\x00", "true").split("\x00")
        value = pc.binary_join_element_wise(
            '{"after":{"category_id":',
            pa.array(category).cast(pa.string()),
            ',"description":"',
            description,
            '","id":',
            id_text,
            ',"name":"',
            name,
            '"},"before":null,"op":"r",',
            before,
            sequence,
            after,
            f',"ts_ms":{BASE_TS_MS + self.lsn + 5}}}',
            "",
        )
        key = pc.binary_join_element_wise('{"id":', id_text, "}", "")
        return ProducerColumns(self.topic("products"), key.cast(pa.binary()), value.cast(pa.binary()), BASE_TS_MS + self.lsn)

    def _envelope(self, table: str, op: str, row: dict[str, Any], sequence: int) -> bytes:
        source = json.loads("{" + self._source(table, sequence, "true" if op == "r" else "false") + "}")["source"]
        return _canonical({"after": row, "before": None, "op": op, "source": source, "ts_ms": BASE_TS_MS + self.lsn + 5})

    def update(self, table: str, row: dict[str, Any]) -> None:
        """One source transaction updating one row (every column sent)."""
        self.lsn += 0x100
        record = ProducerRecord(
            self.topic(table), _canonical({"id": row["id"]}), self._envelope(table, "u", row, 0), BASE_TS_MS + self.lsn
        )
        with self._open() as log:
            log.append_group([record], "%016X" % self.lsn)


class Phases:
    """Seconds spent in each phase of a sync step of the index, by timing what :mod:`derived_views.views.search`
    calls (its module globals are wrapped; the frames are lazy, so each write's time is its computation)."""

    NAMES = ("state copies", "affected roots", "documents", "terms")

    def __init__(self) -> None:
        from derived_views.views import search

        self.seconds: dict[str, float] = {}
        table = lambda frame, path, *rest: "documents" if path.endswith("/documents") else "terms"  # noqa: E731
        for name, phase in (
            ("sync_states", "state copies"),
            ("affected_keys", "affected roots"),
            ("merge_roots", "documents"),
            ("_merge_terms", "terms"),
            ("overwrite", table),
        ):
            setattr(search, name, self._timed(getattr(search, name), phase))

    def _timed(self, function: Callable[..., Any], phase: str | Callable[..., str]) -> Callable[..., Any]:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                name = phase(*args) if callable(phase) else phase
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        return timed_call

    def take(self) -> dict[str, float]:
        taken, self.seconds = self.seconds, {}
        return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--roots", type=int, default=1_000_000, help="products (documents), default 1,000,000")
    parser.add_argument("--others", type=int, default=1_000, help="categories besides the 1%% one, default 1,000")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument(
        "--deletion-vectors", action="store_true", help="the view tables use deletion vectors (CDC_DELETION_VECTORS=true)"
    )
    args = parser.parse_args()
    if args.roots < 100:
        parser.error("--roots must be at least 100 (1% of them reference the renamed category)")

    from derived_views.definitions import ViewDefinitions
    from derived_views.engine.spark_session import build_spark
    from derived_views.runs import runner
    from derived_views.source.log_location import LogLocation
    from derived_views.write.context import ViewContext

    directory = Path(tempfile.mkdtemp(prefix="cdc-bench-fanout-", dir=args.dir))
    try:
        writer = LogWriter(directory / "log")
        with timed() as written:
            writer.snapshot(args.roots, args.others)
        spark = build_spark("cdc-bench-views-fanout")
        definitions = ViewDefinitions.model_validate({**VIEWS, "source": "bench/views_fanout.py"})
        ctx = ViewContext(
            spark,
            str(directory / "views"),
            LogLocation.of(directory / "log"),
            PREFIX,
            definitions=definitions,
            deletion_vectors=args.deletion_vectors,
        )
        tables = {name: ctx.path("search", "products", name) for name in ("documents", "terms")}
        versions = {name: -1 for name in tables}
        phases = Phases()
        results: list[tuple[str, float, int, int, dict[str, float], list[str]]] = []

        def step(label: str, replace: bool = False) -> float:
            phases.take()
            with timed() as elapsed:
                report = runner.step(ctx, [VIEW], replace=replace)
            if report.failures:
                raise SystemExit(f"{label}: the step failed: {report.failures}")
            written_rows, commits = {}, []
            for name, path in tables.items():
                versions[name], written_rows[name], lines = delta_commits(spark, path, versions[name])
                commits.append(f"{name}: {'; '.join(lines) or 'no commit'}")
            results.append((label, elapsed[0], written_rows["documents"], written_rows["terms"], phases.take(), commits))
            return elapsed[0]

        step("initial build (empty index)")
        writer.update("customers", {"id": 1, "name": "Ada Lovelace"})
        step("floor: a table the index does not read")
        writer.update("categories", {"id": UNUSED, "name": "still unused"})
        step("category of no product renamed")
        hot = args.roots // 100
        for round_ in (1, 2):
            new_name = f"renamed{round_} category"
            writer.update("categories", {"id": HOT, "name": new_name})
            step(f"1% category renamed ({'cold' if round_ == 1 else 'warm'} MERGE)")
            docs = spark.read.format("delta").load(tables["documents"])
            renamed = docs.filter(docs["category_name"] == new_name).count()
            if renamed != hot:
                print(f"WARNING: {renamed} documents carry the new category name, expected {hot}")
        full = step("full recompute (rebuild, replace)", replace=True)
        total = spark.read.format("delta").load(tables["documents"]).count()
        terms = spark.read.format("delta").load(tables["terms"]).count()
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    print(
        f"roots={args.roots:,} (documents after the rebuild: {total:,}, terms rows: {terms:,}) "
        f"categories={args.others + 2:,}; the renamed one is referenced by {hot:,} roots = 1%; "
        f"log written in {written[0]:.1f} s"
    )
    print(
        f"{'step':<44} {'time s':>8} {'docs rewritten':>15} {'terms changed':>14} "
        + " ".join(f"{n:>14}" for n in (*Phases.NAMES, "rest"))
    )
    for label, seconds, docs_rows, terms_rows, spent, _ in results:
        rest = seconds - sum(spent.values())
        print(
            f"{label:<44} {seconds:8.2f} {docs_rows:>15,} {terms_rows:>14,} "
            + " ".join(f"{spent.get(n, 0.0):14.2f}" for n in Phases.NAMES)
            + f" {rest:14.2f}"
        )
    floor = results[1][1]
    _, warm, rewritten, _, warm_spent, _ = results[4]
    _, full, recomputed, _, full_spent, _ = results[5]

    def outputs(spent: dict[str, float]) -> float:
        return spent.get("documents", 0.0) + spent.get("terms", 0.0)

    print(
        f"1% re-index (warm step): {warm:.2f} s, {rewritten:,} documents rewritten ({rewritten / max(total, 1):.2%}) "
        f"| full recompute: {full:.2f} s, {recomputed:,} documents written -> full / incremental = {full / warm:.2f}"
    )
    print(
        f"documents + terms only: re-index {outputs(warm_spent):.2f} s vs recompute from the state copies "
        f"{outputs(full_spent):.2f} s -> {outputs(full_spent) / max(outputs(warm_spent), 1e-9):.2f}"
    )
    print(f"floor (nothing of the index changed): {floor:.2f} s; the 1% re-index costs {warm - floor:.2f} s above it")
    print("commits of each step:")
    for label, *_, commits in results:
        print(f"  {label}")
        for line in commits:
            print(f"    {line}")


if __name__ == "__main__":
    main()

"""The reduction of a log partition's raw rows (:func:`reduce_table`): with Arrow compute
(:func:`reduce_vectorised`) when every event is a plain one-line envelope (no partial row, truncate or
unreadable value), else per event (:mod:`derived_views.events.reduction`), with the same result."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from derived_views.events.reduction import DELETE, decode_all, out_schema, reduce_events_python
from derived_views.events.typed_rows import parse_envelopes, typed_images

_OPS = ("r", "c", "u", "d")


def reduce_vectorised(table: Any, mode: str, row: Any | None = None) -> Any | None:
    """The reduction of raw log rows (an Arrow table) with Arrow compute, or ``None`` when it cannot apply:
    a row with an ``unchanged`` header, or a value that is not a one-line envelope with op ``r``/``c``/
    ``u``/``d`` and a numeric LSN. Tombstones are dropped; ``latest`` keeps :func:`_latest_per_key`'s
    rows, ``all`` every event in order. With ``row`` (:func:`derived_views.events.typed_rows.row_type`) the same
    parse types ``after`` and ``before`` (``parsed`` true, no envelope text), or leaves a value that does
    not parse exactly to Spark (``parsed`` false, its text kept)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    table = _with_tombstone_envelopes(table)
    schema = out_schema(row)
    if table.num_rows == 0:
        return schema.empty_table()
    if table.column("unchanged").null_count != table.num_rows:
        return None
    values = table.column("value")
    parsed, images = _parsed(values, row)
    if parsed is None or parsed.num_rows != table.num_rows:
        return None
    op = parsed.column("op").combine_chunks()
    source = parsed.column("source").combine_chunks()
    if op.null_count or source.null_count or not pc.all(pc.is_in(op, pa.array(_OPS))).as_py():
        return None
    lsn = source.field("lsn")
    if lsn.null_count:
        return None
    seq = pc.fill_null(source.field("sequence"), 0)
    ts = pc.fill_null(source.field("ts_ms"), 0)
    n = table.num_rows
    typed = _typed_columns(images, row, n)
    if images is not None:  # Spark reads the typed columns; the text would only be carried along
        values = pa.chunked_array([pa.nulls(n, pa.string())])
    repeated = _tombstones_after_their_delete(table, op, lsn, seq)
    if repeated is not None:
        keep = pc.invert(repeated)
        table, values, op, lsn, seq, ts = (x.filter(keep) for x in (table, values, op, lsn, seq, ts))
        typed = [x.filter(keep) for x in typed]
        n = table.num_rows
    columns = {
        "topic": table.column("topic").combine_chunks(),
        "partition": table.column("partition").combine_chunks().cast(pa.int32()),
        "offset": table.column("offset").combine_chunks(),
        "key": table.column("key").combine_chunks(),
        "op": op,
        "lsn": lsn,
        "seq": seq,
        "commit_ts_ms": ts,
        "value": values,
        "unchanged": pa.ListArray.from_arrays(pa.Array.from_pandas(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string())),
        "error": pa.nulls(n, pa.string()),
    }
    out = pa.Table.from_arrays([_chunked(column) for column in [*columns.values(), *typed]], schema=schema)
    if mode != "latest":
        return out
    return _latest_per_key(out, columns["key"], lsn, seq)


def _typed_columns(images: tuple[Any, Any] | None, row: Any | None, n: int) -> list[Any]:
    """The ``parsed``, ``after`` and ``before`` columns of ``n`` rows (none without ``row``)."""
    import numpy as np
    import pyarrow as pa

    if row is None:
        return []
    after, before = images if images is not None else (pa.nulls(n, row), pa.nulls(n, row))
    return [pa.array(np.full(n, images is not None)), after, before]


def _parsed(values: Any, row: Any | None) -> tuple[Any | None, Any | None]:
    """The envelopes of ``values`` parsed by Arrow (``None`` when a value is not a one-line envelope),
    and, with ``row``, their ``after`` and ``before`` images typed exactly (``None`` when one is not)."""
    texts = _envelope_lines(values)
    if texts is None:
        return None, None
    parsed = parse_envelopes(texts, row)
    if parsed is not None and row is not None:
        return parsed, typed_images(parsed, row)
    if parsed is None and row is not None:
        return parse_envelopes(texts, None), None
    return parsed, None


def _latest_per_key(out: Any, key: Any, lsn: Any, seq: Any) -> Any:
    """The rows of ``out`` that are their key's latest event (greatest ``(lsn, sequence)``, the later
    one in the log on a tie), and every keyless row, in log order."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = out.num_rows
    keyed = pc.is_valid(key)
    row_number = pa.Array.from_pandas(np.arange(n, dtype=np.int64))
    order = pa.table({"key": key, "lsn": lsn, "seq": seq, "row": row_number}).filter(keyed)
    if not _in_position_order(order.column("lsn").combine_chunks(), order.column("seq").combine_chunks()):
        order = order.take(pc.sort_indices(order, [("lsn", "ascending"), ("seq", "ascending"), ("row", "ascending")]))
        order = pa.table(
            {
                "key": order.column("key"),
                "row": order.column("row"),
                "rank": pa.Array.from_pandas(np.arange(order.num_rows, dtype=np.int64)),
            }
        )
        last = order.group_by("key").aggregate([("rank", "max")]).column("rank_max")
        rows = pc.take(order.column("row"), last)
    else:
        rows = order.group_by("key").aggregate([("row", "max")]).column("row_max")
    # the chosen rows in log order: a mask over the rows (keyless ones and each key's latest)
    chosen = pc.invert(keyed).to_numpy(zero_copy_only=False).copy()
    chosen[(rows.combine_chunks() if isinstance(rows, pa.ChunkedArray) else rows).to_numpy()] = True
    if chosen.all():
        return out
    return out.filter(pa.array(chosen))


def _chunked(column: Any) -> Any:
    import pyarrow as pa

    return column if isinstance(column, pa.ChunkedArray) else pa.chunked_array([column])


def _envelope_lines(values: Any) -> list[Any] | None:
    """The envelopes of ``values`` (a chunked string column without nulls) as newline-delimited JSON
    buffers, one per chunk and without copying the column first; ``None`` when a value holds a newline.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = []
    for chunk in values.chunks:
        if len(chunk) == 0:
            continue
        chunk = chunk.cast(pa.large_string())
        offsets = pa.Array.from_buffers(pa.int64(), len(chunk) + 1, [None, chunk.buffers()[1]], offset=chunk.offset)
        first, last = offsets[0].as_py(), offsets[-1].as_py()
        data = chunk.buffers()[2]
        if data is not None and last > first and data.slice(first, last - first).to_pybytes().find(b"\n") >= 0:
            return None
        lines = pc.binary_join_element_wise(chunk, pa.scalar("", pa.large_string()), pa.scalar("\n", pa.large_string()))
        bounds = pa.Array.from_buffers(pa.int64(), len(lines) + 1, [None, lines.buffers()[1]], offset=lines.offset)
        texts.append(lines.buffers()[2][bounds[0].as_py() : bounds[-1].as_py()])
    return texts


def _with_tombstone_envelopes(table: Any) -> Any:
    """Raw rows without tombstones, except positioned ones, whose value becomes the envelope
    :func:`derived_views.events.reduction.tombstone_envelope` writes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    valued = pc.is_valid(table.column("value"))
    if "deleted_lsn" not in table.column_names:
        return table.filter(valued)
    tombstone = pc.and_(pc.and_(pc.invert(valued), pc.is_valid(table.column("deleted_lsn"))), pc.is_valid(table.column("key")))
    table = table.filter(pc.or_(valued, tombstone))
    if table.num_rows == 0 or not pc.any(pc.is_null(table.column("value"))).as_py():
        return table

    def text(name: str, fill: int = 0) -> Any:
        return pc.fill_null(table.column(name), fill).cast(pa.string())

    synthesized = pc.binary_join_element_wise(
        '{"before":null,"after":null,"op":"d","source":{"lsn":',
        text("deleted_lsn"),
        ',"sequence":',
        text("deleted_seq"),
        ',"ts_ms":',
        text("timestamp_ms"),
        "}}",
        "",
    )
    values = pc.coalesce(table.column("value"), synthesized)
    return table.set_column(table.column_names.index("value"), "value", values)


def _tombstones_after_their_delete(table: Any, op: Any, lsn: Any, seq: Any) -> Any | None:
    """Mask of the tombstones whose delete event is the row right before them (same key and position)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if "deleted_lsn" not in table.column_names or table.num_rows < 2:
        return None
    tombstone = pc.is_valid(table.column("deleted_lsn").combine_chunks())
    if not pc.any(tombstone).as_py():
        return None
    key = table.column("key").combine_chunks()
    n = table.num_rows

    def previous(array: Any) -> Any:
        return pa.concat_arrays([pa.nulls(1, array.type), array.slice(0, n - 1)])

    same = pc.and_(pc.equal(previous(key), key), pc.equal(previous(op), pa.scalar(DELETE)))
    same = pc.and_(same, pc.and_(pc.equal(previous(lsn), lsn), pc.equal(previous(seq), seq)))
    same = pc.and_(same, pc.invert(previous(tombstone)))
    return pc.fill_null(pc.and_(tombstone, same), False)


def _in_position_order(lsn: Any, seq: Any) -> bool:
    """Whether ``(lsn, seq)`` never decreases from one row to the next."""
    import pyarrow.compute as pc

    if len(lsn) < 2:
        return True
    head_lsn, next_lsn = lsn.slice(0, len(lsn) - 1), lsn.slice(1)
    head_seq, next_seq = seq.slice(0, len(seq) - 1), seq.slice(1)
    later = pc.or_(pc.greater(next_lsn, head_lsn), pc.and_(pc.equal(next_lsn, head_lsn), pc.greater_equal(next_seq, head_seq)))
    return bool(pc.all(later).as_py())


def reduce_table(batches: Iterable[Any], mode: str, row: Any | None = None) -> Any:
    """Reduce one log partition's raw rows (Arrow batches) to the events of
    :data:`~derived_views.events.reduction.EVENT_DDL` (an Arrow table).

    ``mode`` is ``"latest"`` (:func:`~derived_views.events.reduction.latest_per_key`) or ``"all"``
    (:func:`~derived_views.events.reduction.fold_all`). The vectorised
    path (:func:`reduce_vectorised`) is taken when it applies, else the per-event one. With ``row``
    (:func:`derived_views.events.typed_rows.row_type`) the rows also carry ``parsed``, ``after`` and
    ``before`` (:func:`derived_views.events.typed_rows.typed_ddl`), typed when the vectorised path could.
    """
    import pyarrow as pa

    collected = list(batches)
    if not collected:
        return out_schema(row).empty_table()
    table = pa.Table.from_batches(collected)
    out = reduce_vectorised(table, mode, row)
    if out is None:
        out = reduce_events_python(list(decode_all(table.to_pydict())), mode, row)
    return out

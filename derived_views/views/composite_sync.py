"""Incremental maintenance of a composite (a search index's documents, a cache entity's entries).

Each composite reads an SCD1 state copy of every table it reads, brought to the sync's watermark first
(:func:`derived_views.write.steps.apply_state`): the warehouse's current table when the warehouse keeps the
table (one copy, one MERGE per step for every view that reads it), else a copy of its own
(``<kind>/<name>/_state/<table>``). A step that writes the warehouse's current tables holds one lock
for its duration (:func:`derived_views.runs.runner.shared_copies_lock`), so no other process moves a shared
copy while a composite is computed from it, and each view stays exact as of the watermark it records.
Its output rows are
then a pure function of those copies (:func:`composed`), and a step re-computes only the *affected*
roots (:func:`affected_roots`), found from the events the output table has not applied yet:

- a root event: its own key (an insert, an update, a delete, a key change's old and new key);
- an event of a joined table: the roots whose chain of joins reaches that row *in the state copies as
  of the watermark*. A root that referenced the row before but no longer does changed itself (or a row
  of its chain changed) in the same range, so it is affected through that change. Found this way, a
  root that a search filter leaves out is found too, so a join change can bring it (back) in;
- an event of a child table: the root its ``on`` columns name now (state as of the watermark) and the
  root whose output row lists the child (``_cdc_children`` of the output as of its last commit): a child
  that moved or was deleted leaves its old parent;
- a truncate of any table: every root (the output is recomputed whole, in one overwrite commit); so
  does a column added with a stored default, whose value every older row of the table gets in the state
  copy (:mod:`derived_views.write.stored_defaults`).

The affected roots are computed from the output table's own progress, so a crash between the state
commits and the output commit is repaired by the next step; recomputing a root again from the same
state gives the same row, so a step applied twice changes nothing (promise 5). The output MERGE, on
``_cdc_key``, deletes the affected roots that no longer yield a row (deleted, or filtered out), updates
the others and inserts the new ones, in one commit that carries the new progress.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import reduce
from typing import TYPE_CHECKING, Any

from derived_views.definitions import ViewDefinitions
from derived_views.engine.commit_progress import committing
from derived_views.engine.delta_sql import history, is_delta_table, is_local, merge_into
from derived_views.engine.progress import Progress
from derived_views.errors import DefinitionChangedError
from derived_views.events.column_names import from_stored, quote, stored
from derived_views.events.metadata_columns import KEY, LSN, OP
from derived_views.events.schema import TableSchema
from derived_views.source.as_of import LogAsOf, pending_events
from derived_views.source.table_step import TableStep
from derived_views.views import warehouse
from derived_views.views.composite import Composite, Link, Nested, SourceTable
from derived_views.write.apply import overwrite as replace_table
from derived_views.write.context import ViewContext
from derived_views.write.steps import TableResult, apply_state, load_pending, mark_as_of
from log_store.topic_names import dir_name

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: Output column listing the children an entry holds (``<child alias>#<child _cdc_key>``).
CHILDREN = "_cdc_children"
#: Set on rows of an affected-roots MERGE source that have an output row.
PRESENT = "_cdc_present"


def path(ctx: ViewContext, plan: Composite, table: str) -> str:
    """Path of one of the view's tables (``documents``, ``terms``, ``entries``, ``_dead_letter``)."""
    return ctx.path(plan.kind, plan.name, table)


def state_path(ctx: ViewContext, plan: Composite, table: SourceTable) -> str:
    """Path of the SCD1 copy of a source table the view reads: the warehouse's current table when the
    warehouse keeps the table (:func:`shared`), else the view's own."""
    if shared(ctx.definitions, table):
        return warehouse.current_path(ctx, table.log_name)
    return ctx.path(plan.kind, plan.name, "_state", dir_name(table.log_name))


def shared(definitions: ViewDefinitions, table: SourceTable) -> bool:
    """Whether composites read ``table`` from the warehouse's current table (the warehouse keeps it)."""
    return definitions.warehouse.keeps(table.dotted_name)


def tables_read(ctx: ViewContext, plan: Composite, outputs: Iterable[str]) -> list[str]:
    """Paths of every table a step of the view reads or writes: its state copies and ``outputs``."""
    return [*(state_path(ctx, plan, table) for table in plan.tables), *(path(ctx, plan, name) for name in outputs)]


def source_schemas(ctx: ViewContext, as_of: LogAsOf, plan: Composite) -> dict[str, TableSchema]:
    """The schema of every table the plan reads, by log name."""
    return {table.log_name: ctx.schema(as_of.watermark, table.log_name) for table in plan.tables}


def check_definition(plan: Composite, path: str, progress: Progress | None) -> None:
    """Raise :class:`DefinitionChangedError` when the table at ``path`` was computed with another definition."""
    if progress is not None and progress.position and progress.definition.split("/")[0] != plan.fingerprint:
        raise DefinitionChangedError(plan.view, path)


def reshaped(plan: Composite, progress: Progress) -> bool:
    """Whether the output was computed with other columns than the plan's now (see :attr:`Composite.stamp`)."""
    return progress.definition != plan.stamp


def sync_states(
    ctx: ViewContext, as_of: LogAsOf, plan: Composite, schemas: Mapping[str, TableSchema], *, replace: bool
) -> list[TableResult]:
    """Bring the view's state copy of every table it reads to the range's watermark."""
    results = []
    for table in plan.tables:
        dead_letters = warehouse.dead_letter_path(ctx) if shared(ctx.definitions, table) else path(ctx, plan, "_dead_letter")
        schema = schemas[table.log_name]
        step = TableStep(as_of, [schema.topic], state_path(ctx, plan, table), "latest", replace=replace)
        result = apply_state(ctx, step, schema, dead_letters)
        if result is not None:
            results.append(result)
    return results


def held_since(ctx: ViewContext, plan: Composite) -> int:
    """The commit LSN of the newest event the view's state copies hold (after :func:`sync_states`): the
    view's output, a pure function of them, holds no newer one."""
    return max(ctx.progress(state_path(ctx, plan, table)).since_lsn for table in plan.tables)


def _state(ctx: ViewContext, plan: Composite, table: SourceTable) -> DataFrame:
    """The view's state copy of ``table``, its columns under their source names."""
    return from_stored(ctx.spark.read.format("delta").load(state_path(ctx, plan, table)), table.columns)


def _equal(left: list[str], right: list[str]) -> Column:
    from pyspark.sql import functions as F

    return reduce(lambda a, b: a & b, [F.col(a) == F.col(b) for a, b in zip(left, right, strict=True)])


def _needed(plan: Composite, owner: str | None, table: SourceTable, own: tuple[str, ...]) -> list[str]:
    """Columns of ``table`` (the root when ``owner`` is ``None``, else join ``owner``) the rows need."""
    wanted = set(own) | set(table.key) | {c for link in plan.links if link.parent == owner for c in link.on}
    return [c for c in table.columns if c in wanted]


def composed(ctx: ViewContext, plan: Composite, roots: DataFrame | None) -> DataFrame:
    """The output rows of the roots in ``roots`` (a frame with ``_cdc_key``; ``None``: every root), from
    the state copies: the root's kept columns and each join's under their output names (a root whose
    joined row is missing gets NULL there), ``_cdc_key``, ``_cdc_lsn`` (the newest event among the rows
    it was computed from) and, for a cache entity, each child array and :data:`CHILDREN`."""
    from pyspark.sql import functions as F

    root = _state(ctx, plan, plan.root)
    if roots is not None:
        root = root.join(roots, KEY, "left_semi")
    internal: dict[tuple[int, str], str] = {}
    owners = {None: 0} | {link.alias: index for index, link in enumerate(plan.links, 1)}
    picked = []
    for column in _needed(plan, None, plan.root, plan.columns):
        internal[(0, column)] = f"_cdc_c0_{len(internal)}"
        picked.append(F.col(quote(column)).alias(internal[(0, column)]))
    frame = root.select(*picked, F.col(KEY), F.col(LSN).alias("_cdc_lsn0"))
    for index, link in enumerate(plan.links, 1):
        columns = _needed(plan, link.alias, link.table, tuple(source for _, source in link.columns))
        for column in columns:
            internal[(index, column)] = f"_cdc_c{index}_{len(internal)}"
        joined = _state(ctx, plan, link.table).select(
            *[F.col(quote(c)).alias(internal[(index, c)]) for c in columns], F.col(LSN).alias(f"_cdc_lsn{index}")
        )
        parent = owners[link.parent]
        frame = frame.join(
            joined, _equal([internal[(parent, c)] for c in link.on], [internal[(index, c)] for c in link.table.key]), "left"
        )
    outputs = [F.col(internal[(0, c)]).alias(c) for c in plan.columns]
    outputs += [F.col(internal[(owners[link.alias], source)]).alias(name) for link in plan.links for name, source in link.columns]
    lsns = [F.col(f"_cdc_lsn{i}") for i in range(len(plan.links) + 1)]
    if plan.children:
        frame, children, child_lsns, members = _with_children(ctx, plan, frame, [internal[(0, c)] for c in plan.root.key])
        outputs += children
        lsns += child_lsns
        outputs.append(members)
    keys = [F.col(internal[(0, c)]).alias(f"_cdc_rootkey{i}") for i, c in enumerate(plan.root.key)]
    greatest = F.greatest(*lsns) if len(lsns) > 1 else lsns[0]
    return frame.select(*outputs, *keys, F.col(KEY), greatest.alias(LSN))


def _with_children(
    ctx: ViewContext, plan: Composite, frame: DataFrame, root_key: list[str]
) -> tuple[DataFrame, list[Column], list[Column], Column]:
    """``frame`` joined with each child array (sorted by ``order_by``, then the child's key)."""
    from pyspark.sql import functions as F

    arrays, lsns, members = [], [], []
    parents = frame.select(*root_key)
    for index, child in enumerate(plan.children):
        on = [f"_cdc_on{index}_{i}" for i in range(len(child.on))]
        rows = _state(ctx, plan, child.table)
        rows = rows.select(*[F.col(quote(c)).alias(name) for c, name in zip(child.on, on, strict=True)], "*")
        rows = rows.join(parents, _equal(on, root_key), "left_semi")
        order = F.struct(*[F.col(quote(c)) for c in (*child.order_by, *child.table.key)])
        value = F.struct(*[F.col(quote(c)) for c in child.columns])
        grouped = rows.groupBy(*on).agg(
            F.transform(F.array_sort(F.collect_list(F.struct(order.alias("o"), value.alias("v")))), lambda pair: pair["v"]).alias(
                f"_cdc_rows{index}"
            ),
            F.max(LSN).alias(f"_cdc_child_lsn{index}"),
            F.collect_list(F.concat(F.lit(f"{child.alias}#"), F.col(KEY))).alias(f"_cdc_members{index}"),
        )
        frame = frame.join(grouped, _equal(root_key, on), "left")
        arrays.append(F.coalesce(F.col(f"_cdc_rows{index}"), F.array()).alias(child.alias))
        lsns.append(F.col(f"_cdc_child_lsn{index}"))
        members.append(F.coalesce(F.col(f"_cdc_members{index}"), F.array().cast("array<string>")))
    return frame, arrays, lsns, F.array_sort(F.concat(*members)).alias(CHILDREN)


def affected_roots(
    ctx: ViewContext, as_of: LogAsOf, plan: Composite, schemas: Mapping[str, TableSchema], progress: Progress, output: str
) -> DataFrame | None:
    """``_cdc_key`` of every root the events after ``progress`` affect (see the module docstring), held
    in the driver: one Spark job per table with events finds them, and the step's later jobs read them
    as a local relation (deterministic, no checkpoint to write); ``None`` when a truncate among them
    means every root."""
    keys = affected_keys(ctx, as_of, plan, schemas, progress, output)
    return None if keys is None else roots_frame(ctx, keys)


def roots_frame(ctx: ViewContext, keys: Any) -> DataFrame:
    """The roots ``keys`` (a pyarrow table of :func:`affected_keys`) as a local relation of ``ctx``'s session
    (each session of a step builds its own: a frame is not shared between sessions)."""
    return ctx.spark.createDataFrame(keys, f"{KEY} string")


def affected_keys(
    ctx: ViewContext, as_of: LogAsOf, plan: Composite, schemas: Mapping[str, TableSchema], progress: Progress, output: str
) -> Any:
    """The roots of :func:`affected_roots` as a pyarrow table of ``_cdc_key`` in the driver (``None``:
    every root)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    found: list[Any] = []  # each a pyarrow string array of keys
    for table in plan.tables:
        topic = schemas[table.log_name].topic
        if not pending_events(as_of.watermark, [topic], progress):
            continue  # no event of this table in the range
        step = TableStep(as_of, [topic], state_path(ctx, plan, table), "latest", applied=progress)
        batch = load_pending(ctx, step, schemas[table.log_name], dead_letter_path=path(ctx, plan, "_dead_letter"))
        try:
            if batch.facts.truncates or batch.fills:
                return None  # every root: a truncate, or a column's value given to every older row
            rows = from_stored(batch.frame.filter(F.col(OP) != "t"), table.columns)
            parts = []
            if table.log_name == plan.root.log_name:
                parts.append(rows.select(KEY))
            for link in plan.links:
                if link.table.log_name == table.log_name:
                    parts.append(_roots_reaching(ctx, plan, link, rows))
            for child in plan.children:
                if child.table.log_name == table.log_name:
                    parts.append(_parents_of(ctx, plan, child, rows, output))
            if parts:
                found.append(reduce(lambda a, b: a.unionByName(b), parts).distinct().toArrow().column(KEY))
        finally:
            batch.release()
    keys = pc.unique(pa.chunked_array([chunk for column in found for chunk in column.cast(pa.string()).chunks], pa.string()))
    return pa.table({KEY: keys})


def _values(rows: DataFrame, columns: tuple[str, ...]) -> tuple[DataFrame, list[str]]:
    """The distinct non-null values of ``columns`` in ``rows``, as ``_cdc_v<i>``."""
    from pyspark.sql import functions as F

    names = [f"_cdc_v{i}" for i in range(len(columns))]
    values = rows.select(*[F.col(quote(c)).alias(n) for c, n in zip(columns, names, strict=True)]).dropna().distinct()
    return values, names


def _roots_reaching(ctx: ViewContext, plan: Composite, link: Link, rows: DataFrame) -> DataFrame:
    """Roots whose chain of joins reaches a row of ``link``'s table with the key of one of ``rows``."""
    from pyspark.sql import functions as F

    by_alias = {other.alias: other for other in plan.links}
    values, names = _values(rows, link.table.key)
    node = link
    while node.parent is not None:
        parent = by_alias[node.parent]
        holders = _state(ctx, plan, parent.table).join(values, _equal([quote(c) for c in node.on], names), "left_semi")
        names = [f"_cdc_v{i}" for i in range(len(parent.table.key))]
        values = holders.select(*[F.col(quote(c)).alias(n) for c, n in zip(parent.table.key, names, strict=True)]).distinct()
        node = parent
    return _state(ctx, plan, plan.root).join(values, _equal([quote(c) for c in node.on], names), "left_semi").select(KEY)


def _parents_of(ctx: ViewContext, plan: Composite, child: Nested, rows: DataFrame, output: str) -> DataFrame:
    """Roots a changed child belongs to now (state as of the watermark) or was listed under (output)."""
    from pyspark.sql import functions as F

    values, names = _values(rows, child.on)
    now = _state(ctx, plan, plan.root).join(values, _equal([quote(c) for c in plan.root.key], names), "left_semi")
    parents = now.select(KEY)
    if is_delta_table(ctx.spark, output):
        changed = rows.select(F.concat(F.lit(f"{child.alias}#"), F.col(KEY)).alias("_cdc_member"))
        listed = ctx.spark.read.format("delta").load(output).select(KEY, F.explode(CHILDREN).alias("_cdc_member"))
        parents = parents.unionByName(listed.join(changed, "_cdc_member", "left_semi").select(KEY))
    return parents


def table_ddl(frame: DataFrame) -> str:
    """The DDL of ``frame``'s columns (for :meth:`derived_views.write.table_evolution.TableTypes.ensure`)."""
    return ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in frame.schema.fields)


def overwrite(ctx: ViewContext, frame: DataFrame, table: str, progress: Progress) -> None:
    """Replace the table at ``table`` with ``frame`` in one commit carrying ``progress`` (promise 6); its
    columns are stored under their stored names (:mod:`derived_views.events.column_names`, those the table
    holds kept), and what ``ctx`` knew of its columns is forgotten."""
    replace_table(stored(frame, table, ctx.types.of(ctx.spark, table) or {}), table, progress, ctx.types)


def latest_version(ctx: ViewContext, table: str) -> int:
    """The newest commit version of the Delta table at ``table`` (read with ``deltalake`` on local disk: a
    few milliseconds where Spark's ``DESCRIBE HISTORY`` takes a few hundred)."""
    if is_local(table):
        from deltalake import DeltaTable as LocalTable

        return int(LocalTable(table.removeprefix("file://")).version())
    return int(history(ctx.spark, table, 1).first()["version"])  # type: ignore[index]


def merge_with_progress(ctx: ViewContext, table: str, merge: Callable[[], None], progress: Progress) -> None:
    """Run ``merge`` (a MERGE into ``table``) so that ``progress`` is recorded even when it changes nothing.

    Delta may write no commit for a MERGE that changes nothing (the views' sessions ask it to record one,
    :data:`derived_views.write.context.SESSION_CONF`, but a session set up otherwise may not), so its
    progress would be lost and the range read again by every later process; such a step records
    ``progress`` without changing data (:func:`derived_views.write.steps.mark_as_of`)."""
    before = latest_version(ctx, table)
    with committing(ctx.spark, progress):
        merge()
    if latest_version(ctx, table) == before:
        mark_as_of(ctx, table, progress)


def merge_roots(ctx: ViewContext, table: str, roots: DataFrame, rows: DataFrame, progress: Progress) -> None:
    """Bring the affected ``roots`` of the table at ``table`` to ``rows`` (their recomputed output rows)
    in one commit carrying ``progress``: a root without a row is deleted, the others updated or inserted.
    Columns are stored under their stored names (:mod:`derived_views.events.column_names`)."""
    from pyspark.sql import functions as F

    rows = stored(rows, table, ctx.types.of(ctx.spark, table) or {})
    ctx.types.ensure(ctx.spark, table, table_ddl(rows))
    if roots.isEmpty():
        mark_as_of(ctx, table, progress)
        return
    columns = [quote(c) for c in rows.columns if c != KEY]
    source = roots.join(rows.withColumn(PRESENT, F.lit(True)), KEY, "left")
    values = {c: f"s.{c}" for c in [*columns, KEY]}
    builder = (
        merge_into(ctx.spark, table, source, f"t.{KEY} = s.{KEY}")
        .when_matched_delete(condition=f"s.{PRESENT} IS NULL")
        .when_matched_update(values)
        .when_not_matched_insert(values, condition=f"s.{PRESENT} IS NOT NULL")
    )
    merge_with_progress(ctx, table, builder.execute, progress)

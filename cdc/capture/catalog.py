"""Catalog look-ups over an ordinary connection: published tables, keys, NOT NULL, non-built-in types.

Capture asks the catalog what pgoutput does not say: a table's primary key when its replica identity is
FULL (pgoutput then flags every column), which columns are NOT NULL (for the schema topic), and the
base type of domains and user types. Answers describe the catalog as it is now; they are used only for
what is stable across a schema change (keys, nullability, type names).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import psycopg

from cdc.capture.errors import SourceError, connection_failure
from cdc.capture.key_marks import KEY_MARK
from cdc.capture.lsn import Lsn
from cdc.capture.published_tables import PublishedTable, TableInfo, publication_rule
from cdc.capture.visibility import SnapshotXids
from event_format.masks import COMMENT_QUERY, Mask, from_comment, from_message, key_id

#: A published table's column list (NULL when the publication names none: ``attnames`` then lists every
#: column, generated ones too) and row filter, over ``pg_publication_tables p``, its publication
#: ``pg_publication pub`` and the table's ``pg_class c`` (PostgreSQL 15 and later).
RULE_OF_TABLE = (
    "CASE WHEN EXISTS (SELECT 1 FROM pg_publication_rel pr WHERE pr.prpubid = pub.oid "
    "AND pr.prrelid = c.oid AND pr.prattrs IS NOT NULL) THEN p.attnames END, p.rowfilter"
)
#: ``pg_publication_tables p`` with the ``pub`` and ``c`` that :data:`RULE_OF_TABLE` reads.
PUBLISHED_FROM = (
    "pg_publication_tables p JOIN pg_publication pub ON pub.pubname = p.pubname "
    "JOIN pg_namespace n ON n.nspname = p.schemaname JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename"
)

#: What a table's rows as a snapshot reads them depend on, per relation (the table and its leaf partitions):
#: its file node (a rewrite or ``TRUNCATE`` gives a new one) and its live columns with their types.
#: Read inside a snapshot it is the state as of the snapshot; read on a fresh connection, the state now.
#: Parameters: the table's OID twice.
RELATION_STATE = (
    "SELECT c.oid::int8, c.relfilenode::int8, (SELECT string_agg(a.attname || ':' || a.atttypid || ':' || a.atttypmod, "
    "',' ORDER BY a.attnum) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) "
    "FROM pg_class c WHERE c.oid = %s OR c.oid IN (SELECT relid FROM pg_partition_tree(%s) WHERE isleaf) ORDER BY 1"
)

#: Session settings that fix the text form of values (see :mod:`cdc.capture.values`).
SESSION_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO -c bytea_output=hex -c IntervalStyle=postgres"


# the table itself, or the leaf partitions below a partitioned table
_LEAVES = (
    "SELECT c.oid AS relid WHERE c.relkind <> 'p' UNION ALL SELECT t.relid FROM "
    "pg_partition_tree(c.oid) t WHERE t.isleaf AND t.relid <> c.oid"
)
_ATTRIBUTE = "FROM pg_attribute a WHERE a.attrelid = l.relid AND a.attnum > 0"
#: a live column the publication publishes, over ``pg_attribute a`` and ``pg_publication_tables p``: not
#: generated, or (PostgreSQL 18) a stored generated one the publication publishes
_PUBLISHED = "NOT a.attisdropped AND (a.attgenerated = '' OR {generated})"
_GENERATED_PUBLISHED = "(a.attgenerated = 's' AND a.attname = ANY (p.attnames))"


def _column_marks(version: int) -> str:
    """A published table's column marks per leaf (see :meth:`Catalog.published_tables`), as SQL over ``c``
    and ``p``, for a server of ``version``: before 18 ``pg_publication_tables.attnames`` lists generated
    columns PostgreSQL does not publish, and none is published."""
    published = _PUBLISHED.format(generated=_GENERATED_PUBLISHED if version >= 180000 else "false")
    return (
        "coalesce((SELECT string_agg(l.relid::oid::int8::text || '=' || "
        f"(SELECT coalesce(max(a.attnum), 0) {_ATTRIBUTE}) || '/' || "
        f"(SELECT coalesce(max(a.attnum), 0) {_ATTRIBUTE} AND {published}) || '/' || "
        f"(SELECT coalesce(max(a.attnum), 0) {_ATTRIBUTE} AND {published} AND a.atthasmissing) || '/' || "
        "(SELECT r.relfilenode::int8 FROM pg_class r WHERE r.oid = l.relid) || '/' || "
        "(SELECT coalesce(string_agg(a.attnum || ':' || a.atttypid::int8 || ':' || a.atttypmod || ':' || "
        "substr(md5(a.attname), 1, 8) || ':' || a.xmin::text, ';' "
        f"ORDER BY a.attnum), '') {_ATTRIBUTE} AND {published}) || '/' || {KEY_MARK}, "
        f"',' ORDER BY l.relid::oid::int8) FROM ({_LEAVES}) l), '')"
    )


#: The table's stored generated columns the publication publishes (PostgreSQL 18), as SQL over ``c`` and ``p``.
_GENERATED_OF_TABLE = (
    "ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 "
    f"AND NOT a.attisdropped AND {_GENERATED_PUBLISHED} ORDER BY a.attnum)"
)


def wal_end_sql(primary: str) -> str:
    """SQL for the end of the WAL a server can decode: ``primary`` (a WAL position function) on a primary,
    the replay position on a standby (:mod:`cdc.capture.standby`)."""
    return f"(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE {primary} END)"


class Catalog:
    """Lazily connected catalog reader; reconnects when its connection was lost. Not thread-safe."""

    def __init__(self, url: str, *, publication: str = "", mask_key: bytes | None = None, primary_url: str = "") -> None:
        self._url = url
        #: the primary, when ``url`` is a standby capture reads from (:mod:`cdc.capture.standby`): :meth:`flush_wal` asks it
        self._primary_url = primary_url
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._types: dict[int, str] = {}
        self._publication = publication
        self._mask_key = mask_key
        #: the masks the stream applies now, by ``schema.table`` (see :meth:`stream_masks`)
        self._stream_masks: dict[str, dict[str, Mask]] | None = None

    # -- masks ------------------------------------------------------------------------------------------

    def publication_masks(self) -> dict[str, dict[str, Mask]]:
        """The masks the publication's comment holds now, by ``schema.table`` (:mod:`event_format.masks`)."""
        if not self._publication:
            return {}
        rows = self._execute(COMMENT_QUERY, (self._publication,))
        return from_comment(str(rows[0][0]) if rows and rows[0][0] is not None else None)

    def stream_masks(self, schema: str, table: str) -> dict[str, tuple[str, Callable[[str], str]]]:
        """The masks the stream applies to ``schema.table`` now, as spec and function per column.

        They are the publication's at the first call, and change only where the stream carries the
        logical message ``cdc setup`` emits with a change (:meth:`masks_message`), so each change event
        is masked as the masks stood at its position, not as they stand when capture happens to read it.
        """
        if self._stream_masks is None:
            self._stream_masks = self.publication_masks()
        return self.mask_functions(self._stream_masks.get(f"{schema}.{table}", {}))

    def masks_message(self, content: bytes) -> bool:
        """The stream reached a logical message announcing masks: from here on the stream applies them,
        when they are this publication's (True then)."""
        masks = from_message(content, self._publication)
        if masks is None:
            return False
        self._stream_masks = masks
        return True

    def mask_functions(self, masks: Mapping[str, Mask]) -> dict[str, tuple[str, Callable[[str], str]]]:
        """Spec and function of each of ``masks`` (raises :class:`~event_format.masks.MaskError` for a hash
        without ``CDC_MASK_KEY``)."""
        return {column: (mask.spec, mask.function(self._mask_key)) for column, mask in masks.items()}

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            try:
                # the planner's row estimates for partition-tree functions make the publication query
                # look expensive enough for JIT compilation, which took 0.5 s of a 0.01 s query
                self._conn = psycopg.connect(self._url, autocommit=True, options=f"{SESSION_OPTIONS} -c jit=off")
            except psycopg.OperationalError as exc:
                raise SourceError(
                    f"cannot connect to the source database: {connection_failure(exc)}; check CDC_DATABASE_URL"
                ) from None
        return self._conn

    def _execute(self, query: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
        """Run one catalog query; a connection lost since the last query is reopened once."""
        for attempt in (1, 2):
            try:
                return self._connection().execute(query, params).fetchall()  # type: ignore[arg-type]
            except psycopg.OperationalError as exc:
                self.close()
                if attempt == 2:
                    raise SourceError(f"catalog query failed: {str(exc).strip().splitlines()[0]}") from None
        return []

    def published_tables(self, publication: str) -> list[PublishedTable]:
        """Tables of ``publication`` as the publication presents them (roots when via-root).

        Each table's ``membership`` is ``<entry OIDs>:<partition OIDs>``: the OIDs of the catalog rows
        that put the table in the publication (``pg_publication_rel`` rows of the table or of a
        partitioned ancestor, as for a leaf published without ``publish_via_partition_root``; else the
        ``pg_publication_namespace`` rows for ``TABLES IN SCHEMA`` of its schema or of a partitioned
        ancestor's, which publishes partitions living in other schemas too; 0 for ``ALL TABLES``) and the sorted
        OIDs of the partitions below it.
        Both change exactly when the published rows change without a change event of the table:
        removing a table from the publication and adding it back creates a new entry row (the changes
        in between were never sent), and attaching or detaching a partition adds or removes rows of
        a table published via its root (ATTACH/DETACH write no row changes).

        Each table's ``columns`` marks, per leaf relation, what tells whether a column added later gave
        the existing rows values that no change event carried (:func:`columns_filled_since`): its highest
        column number (dropped ones included; numbers are never reused), its highest live published one
        (generated columns are not, but on PostgreSQL 18 the stored ones the publication publishes), its
        highest one holding a stored default for the rows
        that predate it (``atthasmissing``), its relfilenode, and the type (OID and typmod) of each live
        published column by number, with the transaction that last changed its ``pg_attribute`` row.
        ``ADD COLUMN ... DEFAULT`` stores such a value without writing the
        rows, or rewrites the table (a volatile default, an identity, a domain with a constraint or a
        volatile default), and ``ALTER COLUMN ... TYPE`` rewrites it with converted values (``USING``
        any expression); logical decoding sends no change for either.

        Each table's ``column_list`` and ``row_filter`` are what the publication publishes of it
        (PostgreSQL 15 and later; ``pg_publication_tables.attnames`` and ``rowfilter``, which
        PostgreSQL's own table synchronisation reads too): every read of the table reads exactly those
        columns and rows, as pgoutput sends exactly those. A table published via its root has the root's
        list and filter, a leaf published on its own its own (PostgreSQL refuses both on a partitioned
        table published without ``publish_via_partition_root``). A table with a list or a filter has
        ``;rule=<md5 of both>`` appended to its ``membership``: a changed rule makes the rows and columns
        the log holds of it wrong, so it is read again (a table without a rule keeps the membership
        it always had). The table's ``masks`` (the publication's comment, see :mod:`event_format.masks`)
        are part of that digest, with the key's id when one is a hash: new masks or a new key read the
        table again too.
        """
        namespace_entry = (
            "(SELECT string_agg(pn.oid::text, ',' ORDER BY pn.oid) FROM pg_publication_namespace pn "
            "WHERE pn.pnpubid = pub.oid AND pn.pnnspid IN (SELECT r.relnamespace FROM pg_class r "
            "WHERE r.oid IN (SELECT a.relid FROM pg_partition_ancestors(c.oid) a)))"
            if self._server_version() >= 150000
            else "NULL"
        )
        rule = RULE_OF_TABLE if self._server_version() >= 150000 else "NULL::name[], NULL::text"
        generated = _GENERATED_OF_TABLE if self._server_version() >= 180000 else "ARRAY[]::text[]"
        rows = self._execute(
            "SELECT c.oid, p.schemaname, p.tablename, "
            "coalesce((SELECT string_agg(pr.oid::text, ',' ORDER BY pr.oid) FROM pg_publication_rel pr "
            "WHERE pr.prpubid = pub.oid AND (pr.prrelid = c.oid "
            "OR pr.prrelid IN (SELECT a.relid FROM pg_partition_ancestors(c.oid) a))), "
            f"{namespace_entry}::text, '0') || ':' || coalesce((SELECT string_agg(t.relid::oid::int8::text, ',' "
            "ORDER BY t.relid::oid::int8) FROM pg_partition_tree(c.oid) t WHERE t.relid <> c.oid), '') "
            f", {_column_marks(self._server_version())}, {rule}, obj_description(pub.oid, 'pg_publication'), {generated} "
            f"FROM {PUBLISHED_FROM} WHERE p.pubname = %s ORDER BY 2, 3",
            (publication,),
        )
        key = key_id(self._mask_key)
        return [
            _published(*row[:7], masks=_masks_of(row[7], row[1], row[2]), key=key, generated=tuple(map(str, row[8])))  # type: ignore[call-overload]
            for row in rows
        ]

    def _server_version(self) -> int:
        return int(self._connection().info.server_version)

    def table(self, relid: int) -> TableInfo:
        """Everything capture needs about one table, read in one round of queries."""
        heads = self._execute(
            "SELECT n.nspname, c.relname, c.relreplident FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
            (relid,),
        )
        head = heads[0] if heads else None
        if head is None:
            raise SourceError(f"table with OID {relid} no longer exists in the source database")
        columns = self._execute(
            "SELECT attname, atttypid, atttypmod, attnotnull, attnum, attgenerated = 's' FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND attgenerated IN ('', 's') ORDER BY attnum",
            (relid,),
        )
        keys = self._execute(
            "SELECT i.indisprimary, i.indisreplident, a.attname FROM pg_index i "
            "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = %s AND (i.indisprimary OR i.indisreplident) ORDER BY k.ord",
            (relid,),
        )
        self.load_types([int(c[1]) for c in columns])  # type: ignore[call-overload]
        return TableInfo(
            relid=relid,
            schema=str(head[0]),
            table=str(head[1]),
            columns=tuple((str(c[0]), int(c[1]), int(c[2])) for c in columns),  # type: ignore[call-overload]
            primary_key=tuple(str(k[2]) for k in keys if k[0]),
            identity_key=tuple(str(k[2]) for k in keys if k[1]),
            replica_identity={"d": "default", "f": "full", "n": "nothing", "i": "index"}.get(str(head[2]), "default"),
            not_null=frozenset(str(c[0]) for c in columns if c[3]),
            attnums=tuple((str(c[0]), int(c[4])) for c in columns),  # type: ignore[call-overload]
            generated=frozenset(str(c[0]) for c in columns if c[5]),
        )

    def load_types(self, oids: list[int]) -> dict[int, str]:
        """Resolve non-built-in type OIDs to a convertible type name (a domain to its base type)."""
        missing = sorted({oid for oid in oids if oid >= 10000 and oid not in self._types})
        if missing:
            rows = self._execute(
                "SELECT t.oid, CASE WHEN t.typtype = 'd' THEN b.typname ELSE t.typname END "
                "FROM pg_type t LEFT JOIN pg_type b ON b.oid = t.typbasetype WHERE t.oid = ANY(%s)",
                (missing,),
            )
            for oid, name in rows:
                self._types[int(oid)] = str(name)  # type: ignore[call-overload]
        return self._types

    def stored_defaults(self, relid: int) -> dict[int, str | None]:
        """Attribute number -> text form of the value the rows that predate the column hold, for each live
        column of the table that holds one (``pg_attribute.atthasmissing``); ``None`` for a SQL null.

        ``ADD COLUMN ... DEFAULT <constant>`` stores that value once in ``attmissingval`` (an ``anyarray`` of
        one element of the column's type) instead of writing the rows; a rewrite of the table (``VACUUM
        FULL``, ``CLUSTER``, a rewriting ``ALTER TABLE``) writes it into every row and clears it. The
        array's text is cast to ``text[]`` and its element taken: that element is the value's own text
        form (the array output quotes it and the ``text[]`` input unquotes it), whatever the column's
        type (an array, a ``jsonb`` document, a timestamp in this session's ``UTC``), as pgoutput sends
        the column's values, so the column's converter reads it as it reads its values in the stream."""
        rows = self._execute(
            "SELECT attnum, (attmissingval::text::text[])[1] FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND atthasmissing",
            (relid,),
        )
        return {int(r[0]): None if r[1] is None else str(r[1]) for r in rows}  # type: ignore[call-overload]

    def unreadable(self, relids: list[int]) -> list[int]:
        """Those of ``relids`` the connected role may not SELECT from."""
        rows = self._execute(
            "SELECT oid FROM pg_class WHERE oid = ANY(%s) AND NOT has_table_privilege(oid, 'SELECT') ORDER BY oid",
            (relids,),
        )
        return [int(r[0]) for r in rows]  # type: ignore[call-overload]

    def not_immutable_functions(self, names: Sequence[str]) -> list[str]:
        """Those of the ``pg_catalog`` functions ``names`` that have a form that is not immutable, or none."""
        if not names:
            return []
        rows = self._execute(
            "SELECT n FROM unnest(%s::text[]) n WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_proc WHERE "
            "pronamespace = 'pg_catalog'::regnamespace AND proname = n) OR EXISTS (SELECT FROM pg_catalog.pg_proc "
            "WHERE pronamespace = 'pg_catalog'::regnamespace AND proname = n AND provolatile <> 'i') ORDER BY 1",
            (list(names),),
        )
        return [str(r[0]) for r in rows]

    def wal_insert_position(self) -> int:
        """The server's WAL insert position now: every transaction committed so far ends before it
        (also under ``synchronous_commit = off``, where the flush position lags behind commits). On a
        standby (:mod:`cdc.capture.standby`) its replay position: what it can decode."""
        rows = self._execute(f"SELECT {wal_end_sql('pg_current_wal_insert_lsn()')}::text", ())
        return int(Lsn.parse(str(rows[0][0]))) if rows else 0

    def wal_flush_position(self) -> int:
        """The server's WAL flush position now (every synchronous commit so far ends before it); on a
        standby its replay position."""
        rows = self._execute(f"SELECT {wal_end_sql('pg_current_wal_flush_lsn()')}::text", ())
        return int(Lsn.parse(str(rows[0][0]))) if rows else 0

    def current_snapshot(self) -> SnapshotXids:
        """Which transactions a query run on the server now sees (its ``pg_current_snapshot()``); none
        when it gave no answer."""
        rows = self._execute("SELECT pg_current_snapshot()::text", ())
        return SnapshotXids.parse(str(rows[0][0])) if rows else SnapshotXids(0, 0)

    def flush_wal(self) -> None:
        """Make the server flush its WAL: a transaction that takes an ID and commits (one commit record; on a
        server that takes no writes, nothing). A standby capture reads from has its primary do it: the
        standby then receives and replays that WAL."""
        try:
            self._execute("SELECT pg_current_xact_id()::text", ())
        except (SourceError, psycopg.Error):
            if not self._primary_url:
                return  # a role that may not write: the server flushes on its own, later
            try:
                with psycopg.connect(self._primary_url, autocommit=True, connect_timeout=5) as primary:
                    primary.execute("SELECT pg_current_xact_id()::text")
            except psycopg.Error:
                pass  # the primary is away (a promotion under way, say): its WAL comes on its own, later

    def async_commit_delay(self) -> float:
        """Seconds within which the server flushes an asynchronous commit: three times ``wal_writer_delay``."""
        rows = self._execute("SELECT setting::float8 / 1000 FROM pg_settings WHERE name = 'wal_writer_delay'", ())
        return 3 * float(rows[0][0]) + 0.1 if rows else 1.0  # type: ignore[arg-type]

    def relation_state(self, relid: int) -> list[tuple[object, ...]]:
        """The table's :data:`RELATION_STATE` now."""
        return self._execute(RELATION_STATE, (relid, relid))

    def blocking(self, pids: list[int]) -> list[int]:
        """Those of the backends ``pids`` that another session waits for: it waits for a lock one of them
        holds (``ALTER TABLE``, ``TRUNCATE`` of a table they read) or queues behind one.

        ``pg_locks`` and ``pg_blocking_pids`` take the lock manager's locks for a moment; the query lists
        only the sessions that wait, usually none, so it is cheap."""
        rows = self._execute(
            "SELECT DISTINCT b FROM pg_locks w, unnest(pg_blocking_pids(w.pid)) b WHERE NOT w.granted AND b = ANY(%s)",
            (pids,),
        )
        return [int(r[0]) for r in rows]  # type: ignore[call-overload]

    @property
    def type_names(self) -> dict[int, str]:
        """Every non-built-in type resolved so far, OID -> name."""
        return self._types

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _masks_of(comment: object, schema: object, table: object) -> tuple[tuple[str, str], ...]:
    masks = from_comment(str(comment) if comment is not None else None).get(f"{schema}.{table}", {})
    return tuple(sorted((column, mask.spec) for column, mask in masks.items()))


def _published(
    relid: object,
    schema: object,
    table: object,
    membership: object,
    columns: object,
    column_list: object,
    row_filter: object,
    *,
    masks: tuple[tuple[str, str], ...] = (),
    key: str = "",
    generated: tuple[str, ...] = (),
) -> PublishedTable:
    """One row of :meth:`Catalog.published_tables`, its rule (if any) marked in its membership."""
    listed = tuple(str(name) for name in column_list) if isinstance(column_list, list) else None
    where = str(row_filter) if row_filter is not None else None
    rule = publication_rule(listed, where, masks, key, generated)
    return PublishedTable(
        int(str(relid)),
        str(schema),
        str(table),
        f"{membership};rule={rule}" if rule else str(membership),
        str(columns),
        listed,
        where,
        masks,
        generated,
    )

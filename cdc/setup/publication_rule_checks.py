"""Whether a publication's column lists and row filters let the application go on updating and deleting.

PostgreSQL (15 and later) refuses every ``UPDATE`` of a table while a publication that publishes
updates filters its rows on a column outside the table's replica identity ("Column used in the
publication WHERE expression is not part of the replica identity"), or lists columns that leave one of
the identity's out ("Column list used by the publication does not cover the replica identity"); the
same for ``DELETE`` when deletes are published. It checks at the write, on the partition written, with
the rule of the table as published (the root's, for a publication ``publish_via_partition_root``), and
the replica identity of the partition: its primary key (``DEFAULT``), the index it names (``USING
INDEX``), every column (``FULL``) or none (``NOTHING``). A column list on a table whose replica identity
is ``FULL`` is refused whatever columns it lists (15 to 18: "does not cover the replica identity").

PostgreSQL 18 also refuses them when the replica identity holds a generated column the publication does
not publish ("Replica identity must not contain unpublished generated columns"): a virtual one
(PostgreSQL publishes none; only ``FULL`` holds one), or a stored one without ``publish_generated_columns
= stored`` (or a column list naming it). ``cdc setup`` creates its publication with that option on 18
(capture carries stored generated columns to the views like any other); 14 to 17 publish no generated
column and never refuse a write for one.

:func:`rule_problems` and :func:`generated_column_problems` make the same judgements from the catalog,
so that ``cdc setup`` refuses such a publication before capture depends on it (or, for generated
columns, before it creates one). A filter's columns are read from its stored expression
(``pg_publication_rel.prqual``, a node tree whose ``VAR`` nodes name the columns by number).
"""

from __future__ import annotations

import re

from cdc.capture.coverage import Connection

#: Every table of a publication with a column list or a row filter: the published relation, its
#: listed column names (NULL: every column), the names its filter reads (NULL: no filter), and per leaf
#: below it (itself, for a table that is not partitioned) its name and replica identity's columns.
_RULES = """
    SELECT pr.prrelid, n.nspname || '.' || c.relname,
           (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a
            WHERE a.attrelid = pr.prrelid AND a.attnum = ANY (pr.prattrs)),
           pr.prqual::text
    FROM pg_publication_rel pr
    JOIN pg_publication pub ON pub.oid = pr.prpubid
    JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE pub.pubname = %s AND (pr.prattrs IS NOT NULL OR pr.prqual IS NOT NULL)
    ORDER BY 2
"""
_LEAVES = """
    SELECT n.nspname || '.' || c.relname, c.relreplident,
           ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0
                 AND NOT a.attisdropped AND (c.relreplident = 'f' OR a.attnum = ANY (
                     SELECT unnest(i.indkey) FROM pg_index i WHERE i.indrelid = c.oid
                     AND CASE c.relreplident WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident
                     ELSE false END))
                 ORDER BY a.attnum)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE (c.oid = %(oid)s AND c.relkind <> 'p')
       OR c.oid IN (SELECT relid FROM pg_partition_tree(%(oid)s) WHERE isleaf AND relid <> %(oid)s)
    ORDER BY 1
"""
#: A column reference in a stored expression: ``{VAR :varno 1 :varattno 3 ...}``.
_VAR = re.compile(r"\{VAR :varno \d+ :varattno (\d+)")


def filter_columns(conn: Connection, relid: int, qual: str) -> list[str]:
    """The names of the columns of ``relid`` that the stored row filter ``qual`` reads."""
    numbers = sorted({int(number) for number in _VAR.findall(qual)})
    if not numbers:
        return []
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum = ANY (%s) ORDER BY attnum", (relid, numbers)
    ).fetchall()
    return [str(row[0]) for row in rows]


def rule_problems(conn: Connection, publication: str) -> list[str]:
    """One line per table of ``publication`` (per partition below it) whose column list or row filter
    makes PostgreSQL refuse the application's updates or deletes, with the fixes; none when the
    publication publishes neither updates nor deletes, or does not exist."""
    row = conn.execute("SELECT pubupdate, pubdelete FROM pg_publication WHERE pubname = %s", (publication,)).fetchone()
    if row is None or not (row[0] or row[1]):
        return []
    if int(conn.info.server_version) < 150000:
        return []  # no column lists or row filters before PostgreSQL 15
    writes = " and ".join(w for w, published in (("UPDATE", row[0]), ("DELETE", row[1])) if published)
    problems = []
    for relid, table, column_list, qual in conn.execute(_RULES, (publication,)).fetchall():
        filtered = filter_columns(conn, int(relid), str(qual)) if qual is not None else []  # type: ignore[call-overload]
        listed = [str(c) for c in column_list] if column_list is not None else None  # type: ignore[attr-defined]
        for leaf, identity, identity_columns in conn.execute(_LEAVES, {"oid": relid}).fetchall():
            held = list(identity_columns)  # type: ignore[call-overload]
            where = table if leaf == table else f"{leaf} (a partition of {table})"
            outside = [c for c in filtered if identity != "f" and c not in held]
            if outside:
                problems.append(
                    f"publication {publication} filters the rows of {table} on {', '.join(outside)}, which the "
                    f"replica identity of {where} does not hold: PostgreSQL refuses every {writes} of it while "
                    f"the publication publishes them; filter on replica identity columns only (ALTER PUBLICATION "
                    f"{publication} SET TABLE ... WHERE (...)), or give {leaf} a replica identity holding them "
                    f"(ALTER TABLE {leaf} REPLICA IDENTITY USING INDEX on a unique index of NOT NULL columns, or "
                    "REPLICA IDENTITY FULL)"
                )
            if listed is not None and identity == "f":
                problems.append(
                    f"publication {publication} publishes a column list of {table}, and the replica identity of "
                    f"{where} is FULL: PostgreSQL refuses every {writes} of it while the publication publishes them, "
                    f"whatever columns the list names; publish {table} without a column list (ALTER PUBLICATION "
                    f"{publication} SET TABLE {table}), or give {leaf} a replica identity by key (a primary key and "
                    f"ALTER TABLE {leaf} REPLICA IDENTITY DEFAULT, or REPLICA IDENTITY USING INDEX)"
                )
                continue
            left_out = [c for c in held if c not in listed] if listed is not None else []
            if listed is not None and left_out:
                problems.append(
                    f"publication {publication} publishes only the columns {', '.join(listed)} of {table}, which "
                    f"leave out {', '.join(left_out)} of the replica identity of {where}: PostgreSQL refuses every "
                    f"{writes} of it while the publication publishes them; add {', '.join(left_out)} to the "
                    f"column list (ALTER PUBLICATION {publication} SET TABLE {table} (...)), or give {leaf} a "
                    "replica identity the list covers"
                )
    return problems


#: Per leaf below a table (itself, when not partitioned): its name, and each generated column its replica
#: identity holds with its kind (``s`` stored, ``v`` virtual), in column order.
_GENERATED_IN_IDENTITY = """
    SELECT n.nspname || '.' || c.relname, a.attname::text, a.attgenerated::text
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated <> ''
    WHERE ((c.oid = %(oid)s AND c.relkind <> 'p')
           OR c.oid IN (SELECT relid FROM pg_partition_tree(%(oid)s) WHERE isleaf AND relid <> %(oid)s))
      AND (c.relreplident = 'f' OR a.attnum = ANY (
           SELECT unnest(i.indkey) FROM pg_index i WHERE i.indrelid = c.oid
           AND CASE c.relreplident WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident ELSE false END))
    ORDER BY 1, a.attnum
"""


def generated_column_problems(conn: Connection, publication: str, table: str, oid: int) -> list[str]:
    """One line per generated column in the replica identity of ``table`` (OID ``oid``; of each partition
    below it) that makes PostgreSQL 18 refuse the application's updates and deletes once ``publication``
    (as it is, or as ``cdc setup`` creates it) publishes the table, with the fixes; none before 18, or
    when the publication publishes neither updates nor deletes."""
    if int(conn.info.server_version) < 180000:
        return []
    row = conn.execute(
        "SELECT pubupdate OR pubdelete, pubgencols = 's', EXISTS (SELECT 1 FROM pg_publication_rel pr "
        "WHERE pr.prpubid = p.oid AND pr.prattrs IS NOT NULL AND (pr.prrelid = %s "
        "OR pr.prrelid IN (SELECT relid FROM pg_partition_ancestors(%s)))) FROM pg_publication p WHERE pubname = %s",
        (oid, oid, publication),
    ).fetchone()
    if row is not None and not row[0]:
        return []
    # a stored one is published when setup creates the publication, or by an existing one's option; one
    # a column list leaves out is judged with the column list (rule_problems)
    stored_published = row is None or bool(row[1]) or bool(row[2])
    problems = []
    for leaf, column, kind in conn.execute(_GENERATED_IN_IDENTITY, {"oid": oid}).fetchall():
        where = table if leaf == table else f"{leaf} (a partition of {table})"
        if kind == "s" and stored_published:
            continue
        fix = (
            f"run ALTER PUBLICATION {publication} SET (publish_generated_columns = stored) (capture then carries it "
            f"to the views), or give {leaf} a replica identity without it"
            if kind == "s"
            else f"give {leaf} a replica identity without it (a primary key and ALTER TABLE {leaf} REPLICA IDENTITY "
            "DEFAULT, or REPLICA IDENTITY USING INDEX), or make the column STORED"
        )
        problems.append(
            f"the replica identity of {where} holds the {'stored' if kind == 's' else 'virtual'} generated column "
            f"{column}, which publication {publication} does not publish"
            f"{'' if kind == 's' else ' (PostgreSQL publishes no virtual generated column)'}: PostgreSQL refuses "
            f"every UPDATE and DELETE of it while the publication publishes them; {fix}"
        )
    return problems

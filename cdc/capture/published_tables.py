"""A published table as capture knows it: what the publication publishes of it, its columns and keys.

:class:`PublishedTable` is one table a publication publishes, with what makes its published rows what they
are (its membership, column marks, column list, row filter, masks); :class:`TableInfo` is its columns and
keys as the catalog holds them now; :func:`publication_rule` is the digest of its rules that its membership
carries (:func:`rule_of`), so that a changed rule reads the table again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cdc.capture.tables import NamedTable


@dataclass(frozen=True, slots=True)
class PublishedTable(NamedTable):
    """One table a publication publishes (the root, for a partitioned table published via its root)."""

    relid: int
    schema: str
    table: str
    #: What makes the table's published rows what they are besides its own changes (see
    #: :meth:`cdc.capture.catalog.Catalog.published_tables`); a change means the log may miss rows and needs a new snapshot.
    membership: str = ""
    #: Per leaf relation ``<oid>=<highest column number>/<highest published one>/<highest with a stored
    #: default for older rows>/<relfilenode>/<types>``, comma-separated, where ``<types>`` is
    #: ``<attnum>:<type OID>:<typmod>:<first 8 hex digits of the name's md5>:<xmin>`` of each published
    #: column, ``;``-separated, where ``<xmin>`` is the transaction that last changed the column's
    #: ``pg_attribute`` row (see :func:`cdc.capture.column_marks.columns_filled_since`).
    columns: str = ""
    #: The publication's column list for the table (``None``: it lists none, every column is published).
    column_list: tuple[str, ...] | None = None
    #: The publication's row filter for the table, as the server prints it (``None``: every row).
    row_filter: str | None = None
    #: The table's masked columns, ``(column, mask spec)`` in column-name order (:mod:`event_format.masks`).
    masks: tuple[tuple[str, str], ...] = ()
    #: The table's stored generated columns the publication publishes (PostgreSQL 18's
    #: ``publish_generated_columns = stored``, or a column list naming them; none before 18).
    generated: tuple[str, ...] = ()

    def publishes(self, column: str) -> bool:
        """Whether the publication publishes ``column`` of the table (a generated one: see :meth:`published_columns`)."""
        return self.column_list is None or column in self.column_list

    def published_columns(self, info: TableInfo) -> list[tuple[str, int, int]]:
        """The columns of ``info`` the publication publishes, in attribute order, as pgoutput sends them:
        a generated column only when it is one of :attr:`generated`."""
        return [c for c in info.columns if self.publishes(c[0]) and (c[0] not in info.generated or c[0] in self.generated)]


@dataclass(frozen=True, slots=True)
class TableInfo:
    """Columns in attribute order (name, type OID, typmod), primary key, identity index, NOT NULL."""

    relid: int
    schema: str
    table: str
    columns: tuple[tuple[str, int, int], ...]
    primary_key: tuple[str, ...]
    identity_key: tuple[str, ...]
    replica_identity: str
    not_null: frozenset[str]
    #: column name -> its attribute number, which a rename keeps and a drop and re-add changes
    attnums: tuple[tuple[str, int], ...] = ()
    #: the stored generated columns among ``columns`` (published only as :meth:`PublishedTable.published_columns` says)
    generated: frozenset[str] = frozenset()


def rule_of(membership: str | None) -> str:
    """The rule digest a membership carries (empty for a table published without a rule)."""
    return (membership or "").partition(";rule=")[2]


def publication_rule(
    column_list: tuple[str, ...] | None,
    row_filter: str | None,
    masks: tuple[tuple[str, str], ...] = (),
    key: str = "",
    generated: tuple[str, ...] = (),
) -> str:
    """A digest of a table's column list, row filter, masks and published generated columns (empty when it
    has none of them). A hash mask adds the key's :func:`~event_format.masks.key_id`: another key masks
    every value differently."""
    if column_list is None and row_filter is None and not masks and not generated:
        return ""
    text = f"{','.join(column_list) if column_list is not None else '*'}\n{row_filter or ''}"
    if masks:
        hashed = any(spec == "hash" for _, spec in masks)
        text += "\n" + ";".join(f"{column}={spec}" for column, spec in masks) + (f"\n{key}" if hashed else "")
    if generated:
        text += "\ngenerated=" + ",".join(generated)
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()

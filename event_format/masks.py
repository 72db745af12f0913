"""Column masks: what capture writes in place of a column's clear value, in snapshot and stream alike.

A mask keeps a column joinable or recognisable without its value ever leaving PostgreSQL:

* ``hash``: HMAC-SHA256 of the value's text form (the type's output function, as pgoutput sends it and
  the snapshot reads it; UTF-8) under the key ``CDC_MASK_KEY``, as 64 lowercase hex digits. The same
  value under the same key masks the same wherever it is read, so two columns masked this way still
  join. The key is never written anywhere: the log carries only :func:`key_id`, a keyed digest that
  tells a changed key without revealing it.
* ``fixed``: one constant string in place of every value.
* ``truncate``: the first N characters of the text form.

NULL stays NULL under every mask (a null is no secret, and masking it would hide that the value is
missing). A masked column's type, in schema records and the views, is text whatever the source type.

The masks of a publication live in PostgreSQL with it: ``cdc setup`` writes them into the publication's
comment (:func:`comment_text`), so every capture of the publication reads the same masks as its
rules, and in the same transaction emits them as a transactional logical message with the prefix
:data:`MESSAGE_PREFIX` (:func:`message_content`), which reaches a running capture at exactly the
position of the change: no event after it goes out under the old masks.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson

#: The prefix of the logical message that carries a publication's new masks.
MESSAGE_PREFIX = "cdc.masks"
#: The comment of the publication named by the one parameter: where ``cdc setup`` keeps its masks.
COMMENT_QUERY = "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = %s"
#: How the publication's comment starts when it holds masks.
_COMMENT_HEAD = "cdc masks "


class MaskError(ValueError):
    """A mask that cannot be read or applied (an unknown kind, a hash without its key)."""


@dataclass(frozen=True, slots=True)
class Mask:
    """One column's mask: ``kind`` ``hash``, ``fixed`` (with ``text``) or ``truncate`` (with ``length``)."""

    kind: str
    text: str = ""
    length: int = 0

    @property
    def spec(self) -> str:
        """The mask as one string: ``hash``, ``fixed:<text>`` or ``truncate:<n>``."""
        if self.kind == "fixed":
            return f"fixed:{self.text}"
        if self.kind == "truncate":
            return f"truncate:{self.length}"
        return self.kind

    @classmethod
    def parse(cls, spec: str) -> Mask:
        """The mask a :attr:`spec` string names."""
        kind, _, argument = spec.partition(":")
        if kind == "hash" and not argument:
            return cls("hash")
        if kind == "fixed":
            return cls("fixed", text=argument)
        if kind == "truncate" and argument.isdigit() and int(argument) > 0:
            return cls("truncate", length=int(argument))
        raise MaskError(f"unknown mask {spec!r}: use hash, fixed:<text> or truncate:<n> (n > 0)")

    def function(self, key: bytes | None) -> Callable[[str], str]:
        """The mask of one non-null value's text form; a hash needs ``key``."""
        if self.kind == "hash":
            if not key:
                raise MaskError("a hash mask needs CDC_MASK_KEY: set it to a secret of at least 16 bytes")
            digest = hmac.new(key, digestmod=hashlib.sha256)

            def hashed(text: str) -> str:
                keyed = digest.copy()
                keyed.update(text.encode("utf-8"))
                return keyed.hexdigest()

            return hashed
        if self.kind == "fixed":
            fixed = self.text
            return lambda _text: fixed
        length = self.length
        return lambda text: text[:length]


#: ``schema.table`` -> column -> mask
TableMasks = Mapping[str, Mapping[str, Mask]]


def key_id(key: bytes | None) -> str:
    """A digest that changes with the key and reveals nothing of it (empty without a key)."""
    if not key:
        return ""
    return hmac.new(key, b"cdc mask key", hashlib.sha256).hexdigest()[:16]


def message_content(publication: str, masks: TableMasks) -> bytes:
    """The logical message that announces ``publication``'s masks (every table's, not only the changed)."""
    return orjson.dumps(
        {"publication": publication, "masks": _plain(masks)},
        option=orjson.OPT_SORT_KEYS,
    )


def from_message(content: bytes, publication: str) -> dict[str, dict[str, Mask]] | None:
    """The masks a logical message announces for ``publication``; ``None`` when it is about another."""
    data = orjson.loads(content)
    if not isinstance(data, dict) or data.get("publication") != publication:
        return None
    return _parsed(data.get("masks", {}))


def comment_text(masks: TableMasks) -> str | None:
    """The publication's comment holding ``masks`` (``None``: no comment, when there are none)."""
    if not any(masks.values()):
        return None
    return _COMMENT_HEAD + orjson.dumps(_plain(masks), option=orjson.OPT_SORT_KEYS).decode()


def from_comment(comment: str | None) -> dict[str, dict[str, Mask]]:
    """The masks a publication's comment holds (none when it holds no masks)."""
    if not comment or not comment.startswith(_COMMENT_HEAD):
        return {}
    return _parsed(orjson.loads(comment[len(_COMMENT_HEAD) :]))


def _plain(masks: TableMasks) -> dict[str, dict[str, str]]:
    return {table: {column: mask.spec for column, mask in sorted(columns.items())} for table, columns in masks.items() if columns}


def _parsed(data: object) -> dict[str, dict[str, Mask]]:
    if not isinstance(data, dict):
        raise MaskError("masks must be a table of tables")
    return {
        str(table): {str(column): Mask.parse(str(spec)) for column, spec in columns.items()} for table, columns in data.items()
    }

"""Outbox events: messages an application emits in its own transactions, published as records of the log.

An application publishes an event without writing to a second system (no dual write) by emitting a
transactional logical message inside its business transaction::

    SELECT pg_logical_emit_message(true, 'cdc.outbox.orders', '{"order_id": 7, "type": "OrderPlaced"}');

The prefix is ``<CDC_TOPIC_PREFIX>.<CDC_OUTBOX_PREFIX>.`` followed by the topic's own name; the whole
prefix is the topic the event lands in (``cdc.outbox.orders``). No table is written, so there is
nothing to vacuum on the source and nothing to grant but the right to connect.

Guarantees (docs/outbox.md):

* **Exactly once, at its commit's position.** The message is kept with its transaction
  (:class:`~cdc.capture.streaming.TransactionAssembler`) and replayed with the transaction's row changes
  in the order the server sent them (:class:`~cdc.capture.change_replayer.ChangeReplayer`), so the event is
  written in the same group as those changes and the watermark covers both or neither. A transaction
  the log already holds is skipped whole after a restart, its events with it.
* **Only if the transaction commits.** PostgreSQL decodes a transactional message at its
  transaction's commit and drops it with an aborted transaction or a subtransaction rolled back to a
  savepoint. One case is undecidable: in a transaction larger than ``logical_decoding_work_mem``,
  which PostgreSQL streams before its commit, a message carries the top transaction's id, not its
  subtransaction's; when such a transaction rolls back a subtransaction whose changes were already
  streamed, the outbox messages emitted before that rollback may belong to it, so they go to the
  dead letters (:data:`UNSURE`, one warning line per transaction) and the later ones are published. A
  non-transactional message with the outbox prefix would publish an event of a transaction that may
  still roll back: it is refused, one warning line with its LSN, and nothing is written.
* **Order.** Each event carries the headers ``lsn`` (its transaction's commit LSN) and ``sequence``
  (its place among the transaction's events, row changes included), so ``(lsn, sequence)`` orders it
  among every event of the database. With ``CDC_OUTBOX_KEY_FIELD`` set, the key is that top-level
  field of the payload (a string as its UTF-8 text, any other JSON value as its compact JSON): all
  events of one aggregate go to one partition, in commit order. Without it the key is null and events
  are spread over the partitions.
* **Stable ids.** The header ``id`` is ``<commit LSN, 16 hex digits>-<n>``, ``n`` counting the
  transaction's outbox messages from 0: the same on every replay and restart, so a consumer can
  deduplicate by it.
* **Bad input.** A payload that is not JSON, a topic name Kafka cannot hold (or one that is a captured
  table's topic), a missing key field: one warning line naming the LSN and what is wrong, and the
  message goes to the dead-letter topic ``<CDC_TOPIC_PREFIX>.__dead_letters`` in the same group; capture
  goes on and nothing else of the transaction is lost.

This module holds the rules only (no I/O); the replayer calls :meth:`Outbox.event` per message.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from cdc.capture.events import new_record
from cdc.capture.lsn import Lsn
from cdc.capture.pgoutput.messages import LogicalMessage
from event_format import LSN_HEADER, SEQUENCE_HEADER
from log_store import Headers, ProducerRecord
from log_store.errors import InvalidTopicNameError
from log_store.topic import validate_topic_name

#: The header holding an event's id.
ID_HEADER = "id"
#: Why a message of a streamed transaction emitted before one of its subtransactions rolled back is not
#: published: in a transaction PostgreSQL streams before its commit, pgoutput marks a logical message with
#: the top transaction's id, not its subtransaction's (as it marks row changes), so capture cannot tell
#: whether it belongs to the subtransaction rolled back (whose records all precede its abort).
UNSURE = (
    "emitted before a subtransaction rolled back in a transaction PostgreSQL streamed before its commit: "
    "it may belong to the rolled-back subtransaction"
)
#: How the dead-letter topic's name ends, after the topic prefix.
DEAD_LETTERS = ".__dead_letters"


def dead_letter_topic(topic_prefix: str) -> str:
    """Where capture puts outbox messages it cannot publish: ``<prefix>.__dead_letters``."""
    return f"{topic_prefix}{DEAD_LETTERS}"


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message that could not be published: why, and its dead-letter record."""

    reason: str
    record: ProducerRecord


@dataclass(frozen=True)
class Outbox:
    """The outbox rules of one capture.

    ``message_prefix``: how an outbox message's prefix begins (``<topic prefix>.<outbox prefix>.``);
    ``key_field``: the payload field that keys events (empty: none); ``dead_letters``: the dead-letter
    topic; ``table_topic``: whether a topic name is a captured table's (an event is never written there).
    """

    message_prefix: str
    key_field: str
    dead_letters: str
    table_topic: Callable[[str], bool] = lambda topic: False

    #: topics already found good (a topic is checked once per run, not once per event)
    _good: set[str] = field(default_factory=set, compare=False)

    @property
    def prefix_bytes(self) -> bytes:
        """:attr:`message_prefix` as the bytes of the wire."""
        return self.message_prefix.encode()

    def claims(self, prefix: str) -> bool:
        """Whether a message with this prefix is an outbox message."""
        return prefix.startswith(self.message_prefix)

    def event(
        self, message: LogicalMessage, commit_lsn: int, index: int, sequence: int, ts_ms: int, unsure: str | None = None
    ) -> ProducerRecord | Rejected:
        """The record of the ``index``-th outbox message of the transaction committed at ``commit_lsn``
        (at ``sequence`` among its events, committed at ``ts_ms``), or why it is rejected (``unsure``: the
        caller cannot tell whether the message's subtransaction committed, see :data:`UNSURE`).

        Pure: the same message and position give the same record (and id) on every replay.
        """
        return self.message_event(message.prefix, message.content, message.lsn, commit_lsn, index, sequence, ts_ms, unsure)

    def message_event(
        self,
        topic: str,
        content: bytes,
        message_lsn: int,
        commit_lsn: int,
        index: int,
        sequence: int,
        ts_ms: int,
        unsure: str | None = None,
    ) -> ProducerRecord | Rejected:
        """:meth:`event` of a message given by its parts: its prefix (``topic``), content and LSN."""
        headers = (
            (ID_HEADER, b"%016X-%d" % (commit_lsn, index)),
            (LSN_HEADER, b"%d" % commit_lsn),
            (SEQUENCE_HEADER, b"%d" % sequence),
        )
        if unsure is None and topic in self._good:  # the common case, without route's general checks
            try:
                payload = orjson.loads(content)
            except orjson.JSONDecodeError:
                pass  # route says why
            else:
                key_field = self.key_field
                if not key_field:
                    return new_record((topic, None, content, ts_ms, headers))
                if type(payload) is dict:
                    value = payload.get(key_field)
                    if type(value) is str:
                        return new_record((topic, value.encode("utf-8"), content, ts_ms, headers))
                    if type(value) is int:
                        return new_record((topic, b"%d" % value, content, ts_ms, headers))
        return self.route(topic, content, headers, message_lsn, commit_lsn, ts_ms, unsure=unsure)

    def route(
        self,
        topic: str,
        content: bytes | None,
        headers: Headers,
        source_lsn: int,
        commit_lsn: int,
        ts_ms: int,
        *,
        key: bytes | None = None,
        keyed: bool = False,
        json: bool = True,
        unsure: str | None = None,
    ) -> ProducerRecord | Rejected:
        """The record of one event for ``topic``: ``content`` (JSON unless ``json`` is false) with
        ``headers`` (the first is its id), committed at ``commit_lsn`` and ``ts_ms``, or why it is rejected.
        ``keyed``: ``key`` is the event's key as given (an outbox table's aggregate id); otherwise the key
        is the payload's key field, when one is set. ``source_lsn``: where the event is in the WAL."""
        good = topic in self._good
        reason = unsure or (None if good else _topic_problem(topic, self.message_prefix, self.table_topic))
        key_field = None if keyed else self.key_field
        if reason is None and content is None:
            reason = "the payload is null"
        elif reason is None and keyed and key is None:
            reason = "the aggregate id is null"
        elif content is not None and reason is None and (json or key_field):
            try:  # the payload is parsed once: to check it is JSON and to find its key
                payload = orjson.loads(content)
            except orjson.JSONDecodeError as exc:
                reason = f"the payload is not JSON ({exc})"
            else:
                if key_field:
                    key, reason = _key_of(payload, key_field)
        if reason is None:
            if not good:
                self._good.add(topic)
            return new_record((topic, key, content, ts_ms, headers))
        letter = {
            "target": topic,
            "id": headers[0][1].decode("utf-8", "replace"),
            "lsn": commit_lsn,
            "message_lsn": str(Lsn(source_lsn)),
            "error": reason,
            "value": None if content is None else _text_or_base64(content),
        }
        return Rejected(reason, ProducerRecord(self.dead_letters, None, orjson.dumps(letter), ts_ms, headers))


def _topic_problem(topic: str, message_prefix: str, table_topic: Callable[[str], bool]) -> str | None:
    """Why ``topic`` cannot hold outbox events, or None."""
    if topic == message_prefix:
        return f"the prefix {topic!r} names no topic after {message_prefix!r}"
    try:
        validate_topic_name(topic)
    except InvalidTopicNameError:
        return f"{topic!r} is not a topic name Kafka can hold (at most 249 characters of ASCII letters, digits, '.', '_' and '-')"
    if table_topic(topic):
        return f"{topic!r} is the topic of a captured table"
    return None


def _key_of(payload: object, field: str) -> tuple[bytes | None, str | None]:
    """The key ``field`` of ``payload`` gives (a string's UTF-8 text, else compact JSON), or why there is none."""
    if type(payload) is not dict:
        return None, f"the payload is not a JSON object, so it has no key field {field!r}"
    value = payload.get(field)
    if type(value) is str:
        return value.encode("utf-8"), None
    if type(value) is int:
        return b"%d" % value, None  # its compact JSON, without the encoder's call
    if value is None:
        return None, f"the payload has no key field {field!r} (or it is null)"
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS), None


def _text_or_base64(content: bytes) -> object:
    """A payload for a dead letter's JSON: its text when it is UTF-8, else ``{"base64": ...}``."""
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(content).decode("ascii")}

"""Reaching Kafka: where the log lives and how to connect (:class:`KafkaSettings`), the one error every
failure of it becomes (:class:`KafkaLogError`, saying whether a retry may cure it), and librdkafka's
own log lines routed to Python's logging."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError

from log_store.errors import LogStoreError


class _ClientLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """librdkafka's own lines (a failed connect each retry, say), at debug level: what they mean for the
    log is said once, by the error the operation raises."""

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        super().log(logging.DEBUG, msg, *args, **kwargs)


client_log = _ClientLog(logging.getLogger("log_store.kafka.client"), {})


class KafkaLogError(LogStoreError):
    """Kafka refused or could not be reached; the message says what failed and what to do."""

    exit_code = 5

    #: The fix of client settings a client cannot be made with (see :meth:`client_settings`).
    CLIENT_SETTINGS_FIX = (
        "check the CDC_KAFKA_* client settings: the CDC_KAFKA_SSL_* files must be PEM, and "
        "CDC_KAFKA_SSL_KEY_PASSWORD must open an encrypted key"
    )

    def __init__(self, bootstrap: str, what: str, error: object, *, lasting: bool = False, fix: str | None = None) -> None:
        """``fix`` replaces the default advice (brokers up, settings right) after the error's text."""
        self.bootstrap, self.error = bootstrap, error
        #: another writer of the prefix took over: retrying cannot help
        self.fenced = fenced(error)
        #: whether starting again may cure it (the brokers down or unreachable), rather than a refused login,
        #: a missing permission, a setting the cluster refuses, fencing or a record too large for a topic
        self.retriable = not (self.fenced or lasting or (isinstance(error, KafkaError) and error.code() in _LASTING_CODES))
        text = error.str() if isinstance(error, KafkaError) else str(error)
        writing = "group" in what
        if fix is not None:
            message = f"Kafka at {bootstrap}: {what} failed ({text}); {fix}"
        elif fenced(error):
            message = (
                f"Kafka at {bootstrap}: {what} failed: another writer of the same topic prefix started "
                "(a second capture with this CDC_TOPIC_PREFIX) and took over the log, so this one stops; "
                "nothing of its unfinished group is visible to readers; run one capture per prefix"
            )
        else:
            message = (
                f"Kafka at {bootstrap}: {what} failed ({text}); check that the brokers are up and reachable "
                "and that CDC_LOG and the CDC_KAFKA_* client settings are right"
            )
            if what == "committing a group":
                message += (
                    "; the group may or may not be committed, and capture confirms nothing past the "
                    "watermark it reads from Kafka when it starts again, so nothing is lost or doubled"
                )
            elif writing:
                message += (
                    "; nothing of the failed group is visible to readers, and capture confirms nothing past what Kafka committed"
                )
        super().__init__(message)

    @classmethod
    def client_settings(cls, bootstrap: str, error: object) -> KafkaLogError:
        """A client cannot be made with the CDC_KAFKA_* settings (a key or certificate that does not open):
        a lasting error whose fix is in those settings, not in the brokers."""
        return cls(bootstrap, "setting up a client", error, lasting=True, fix=cls.CLIENT_SETTINGS_FIX)


#: A newer producer with the same transactional id took over. (``INVALID_PRODUCER_EPOCH`` is not here: a
#: transaction the broker aborted after ``transaction.timeout.ms`` bumps the epoch too, and a restart helps.)
_FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED}
#: Errors a restart cannot cure: a refused login or permission, a setting the cluster refuses, a record too large.
_LASTING_CODES = {
    KafkaError._AUTHENTICATION,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError._SSL,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.INVALID_REPLICATION_FACTOR,
    KafkaError.POLICY_VIOLATION,
    KafkaError.INVALID_CONFIG,
}


def fenced(error: object) -> bool:
    """Whether ``error`` says a newer writer with the same transactional id took over."""
    return isinstance(error, KafkaError) and error.code() in _FENCED_CODES


@dataclass(frozen=True)
class KafkaSettings:
    """Where the log lives in Kafka and how to reach it.

    ``client`` holds librdkafka properties every client gets (``security.protocol``, ``sasl.*``,
    ``ssl.*``); ``prefix`` names the watermark topic and the transactional id, so two pipelines with
    different prefixes share a cluster without meeting.
    """

    bootstrap: str
    prefix: str
    client: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold a password
    delete_retention_ms: int = 24 * 3600 * 1000
    retention_ms: int = -1
    retention_bytes: int = -1
    #: how long one request (metadata, a group's deliveries, a commit, a read) may take before it fails
    timeout_s: float = 10.0
    transaction_timeout_ms: int = 600_000

    @property
    def watermark_topic(self) -> str:
        return f"{self.prefix}.__watermarks"

    @property
    def transactional_id(self) -> str:
        return f"{self.prefix}.capture"

    def describe(self) -> str:
        return f"kafka://{self.bootstrap}"

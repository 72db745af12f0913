"""Where the views read the log: the embedded log's directory, or Kafka with its client settings.

The views read a pending range two ways (:mod:`derived_views.source.pending`): in the driver when it is small,
and by Spark tasks when it is large. On the embedded log the tasks read through the ``cdclog`` source
(:mod:`derived_views.source.log_source`); on Kafka through Spark's own Kafka source, whose client settings
:meth:`LogLocation.spark_options` translates from the librdkafka ones capture uses (the Java client
names its TLS and SASL settings differently). Either way a range ends at a watermark's end offsets,
and Kafka is read ``read_committed``, so a batch never holds part of a source transaction.

``str()`` of a location is safe to print: a directory, or ``kafka://`` and the brokers (never a password).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from log_store.kafka.log import KafkaSettings
    from log_store.log import LogReader

#: SASL mechanisms and the Java login module each takes a user name and password with.
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


@dataclass(frozen=True)
class LogLocation:
    """The embedded log at ``path``, or the log in Kafka (``kafka`` set)."""

    path: str = ""
    kafka: KafkaSettings | None = None

    @classmethod
    def of(cls, where: LogLocation | str | Path) -> LogLocation:
        """``where`` as a location: a location as it is, a path as the embedded log's directory."""
        return where if isinstance(where, LogLocation) else cls(path=str(where))

    def __str__(self) -> str:
        return self.kafka.describe() if self.kafka is not None else self.path

    def exists(self) -> bool:
        """Whether there may be a log to read (an embedded log's directory exists; Kafka is asked when read)."""
        return self.kafka is not None or Path(self.path).exists()

    def open(self) -> LogReader:
        """The log, opened read-only (a :class:`~log_store.LogStore` or a :class:`~log_store.kafka.log.KafkaLog`)."""
        if self.kafka is not None:
            from log_store.kafka.log import KafkaLog

            return KafkaLog.open(self.kafka)
        from log_store import LogStore

        return LogStore.open(Path(self.path))

    def spark_options(self) -> dict[str, str]:
        """Options of Spark's Kafka source for this Kafka log: brokers, TLS and SASL as the Java client names them."""
        assert self.kafka is not None
        client = dict(self.kafka.client)
        options = {"kafka.bootstrap.servers": self.kafka.bootstrap}
        protocol = client.get("security.protocol")
        if protocol:
            options["kafka.security.protocol"] = protocol.upper()
        mechanism = client.get("sasl.mechanism")
        if mechanism:
            options["kafka.sasl.mechanism"] = mechanism
            module = _LOGIN_MODULES.get(mechanism)
            if module is not None:
                user, password = client.get("sasl.username", ""), client.get("sasl.password", "")
                options["kafka.sasl.jaas.config"] = (
                    f"{module} required username={_jaas_quoted(user)} password={_jaas_quoted(password)};"
                )
        if client.get("ssl.ca.location"):  # inline, so that executors on other machines need no file
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.certificates"] = Path(client["ssl.ca.location"]).read_text()
        if client.get("ssl.certificate.location") and client.get("ssl.key.location"):
            options["kafka.ssl.keystore.type"] = "PEM"
            options["kafka.ssl.keystore.certificate.chain"] = Path(client["ssl.certificate.location"]).read_text()
            options["kafka.ssl.keystore.key"] = _java_key(
                self.kafka.bootstrap, Path(client["ssl.key.location"]), client.get("ssl.key.password") or None
            )
        return options


def _java_key(bootstrap: str, path: Path, password: str | None) -> str:
    """The PEM private key at ``path`` (PKCS#1, SEC1 or PKCS#8, encrypted with ``password`` or not) as
    unencrypted PKCS#8, the one form the Java client opens everywhere.

    The Java client reads only PKCS#8, and on Java 17 it cannot open the scheme OpenSSL 3 encrypts keys with
    by default (PBES2: "PBES2 SecretKeyFactory not available"), which librdkafka opens. The key is opened
    here with its password instead; it travels in the source's options as the SASL password does, which
    Spark's Kafka source never logs and :data:`~derived_views.engine.spark_session.SESSION_DEFAULTS` redacts from
    plans.
    """
    from cryptography.hazmat.primitives import serialization

    from log_store.kafka.log import KafkaLogError

    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password.encode() if password else None)
    except (OSError, ValueError, TypeError) as exc:  # unreadable, not a PEM key, or the wrong password
        raise KafkaLogError.client_settings(bootstrap, f"the key {path} cannot be opened: {exc}") from None
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()


def _jaas_quoted(text: str) -> str:
    """``text`` as a JAAS option value: in double quotes, with ``\\`` and ``"`` escaped (any other
    character, non-ASCII ones included, as it is)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

"""Spark's Kafka source options built from the librdkafka settings capture uses, and kept out of plans
(no broker needed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cryptography.hazmat.primitives import serialization

from derived_views.engine.spark_session import SESSION_DEFAULTS
from derived_views.source.log_location import LogLocation
from log_store.kafka.log import KafkaLogError, KafkaSettings
from tests.fix_tls import make_tls_files

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _options(**client: str) -> dict[str, str]:
    return LogLocation(kafka=KafkaSettings("b1:9092,b2:9092", "p", client)).spark_options()


def test_sasl_login_is_a_jaas_config_with_its_values_quoted() -> None:
    options = _options(
        **{"security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": 'a"b', "sasl.password": "p\\w;d"}
    )
    assert options["kafka.bootstrap.servers"] == "b1:9092,b2:9092"
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="a\\"b" password="p\\\\w;d";'
    )


def test_tls_files_go_inline_and_an_encrypted_client_key_is_opened_for_the_java_client(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    options = _options(
        **{
            "security.protocol": "ssl",
            "ssl.ca.location": str(files.ca),
            "ssl.certificate.location": str(files.client_certificate),
            "ssl.key.location": str(files.client_key),
            "ssl.key.password": files.client_key_password,
        }
    )
    assert options["kafka.ssl.truststore.certificates"] == files.ca.read_text()
    assert options["kafka.ssl.keystore.certificate.chain"] == files.client_certificate.read_text()
    key = options["kafka.ssl.keystore.key"]
    assert key.startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8, not encrypted: Java 17 cannot open PBES2
    assert "kafka.ssl.key.password" not in options
    opened = serialization.load_pem_private_key(key.encode(), None)
    original = serialization.load_pem_private_key(files.client_key.read_bytes(), files.client_key_password.encode())
    assert opened.private_numbers() == original.private_numbers()  # type: ignore[union-attr]


def test_a_client_key_that_cannot_be_opened_is_one_clear_error_without_the_password(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    with pytest.raises(KafkaLogError) as wrong:
        _options(
            **{
                "ssl.certificate.location": str(files.client_certificate),
                "ssl.key.location": str(files.client_key),
                "ssl.key.password": "not-the-password",
            }
        )
    message = str(wrong.value)
    assert str(files.client_key) in message and "CDC_KAFKA_SSL_KEY_PASSWORD" in message
    assert "not-the-password" not in message and not wrong.value.retriable


@pytest.mark.spark
def test_the_login_and_the_client_key_are_redacted_and_never_appear_in_a_plan(tmp_path: Path, spark: SparkSession) -> None:
    files = make_tls_files(tmp_path)
    options = _options(
        **{
            "security.protocol": "sasl_ssl",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "cdc",
            "sasl.password": "the-sasl-secret",
            "ssl.ca.location": str(files.ca),
            "ssl.certificate.location": str(files.client_certificate),
            "ssl.key.location": str(files.client_key),
            "ssl.key.password": files.client_key_password,
        }
    )
    # Spark redacts an option whose name matches the sessions' regex, wherever it prints options
    redacted = re.compile(spark.conf.get("spark.sql.redaction.options.regex") or "")
    assert spark.conf.get("spark.sql.redaction.options.regex") == SESSION_DEFAULTS["spark.sql.redaction.options.regex"]
    secret = {name for name, value in options.items() if "the-sasl-secret" in value or "PRIVATE KEY" in value}
    assert secret == {"kafka.sasl.jaas.config", "kafka.ssl.keystore.key"}
    assert {name for name in options if redacted.search(name)} == secret  # certificates and brokers stay visible
    key_body = options["kafka.ssl.keystore.key"].splitlines()[1]
    frame = spark.read.format("kafka").options(**options).option("subscribe", "p.public.t").load()
    plan = frame._jdf.queryExecution().analyzed().toString()  # planning further would ask the brokers
    assert "Subscribe[p.public.t]" in plan, plan
    assert "the-sasl-secret" not in plan and key_body not in plan, plan

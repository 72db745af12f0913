"""A real Kafka broker for tests, and a topic prefix of its own per test.

The broker comes from ``CDC_TEST_KAFKA`` (``host:port`` of a running cluster) or is started once per
test session from the jars set-up fetched (:class:`local_servers.kafka.LocalKafka`: KRaft, one node, a free
loopback port) and removed afterwards. Tests share it; each gets a fresh topic prefix, so their
topics, watermarks and transactional ids never meet.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from local_servers.kafka import LocalKafka


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a broker for the whole test session."""
    explicit = os.environ.get("CDC_TEST_KAFKA")
    if explicit:
        yield explicit
        return
    with LocalKafka() as broker:
        yield broker.bootstrap


@pytest.fixture
def kafka_prefix() -> str:
    """A topic prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"

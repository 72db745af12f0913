"""The log in a real Kafka broker: topics, placement, whole groups through kill -9, fencing, watermarks."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from log_store import ProducerColumns, ProducerRecord, TopicPartition
from log_store.errors import InvalidRecordError, ReadOnlyError, TopicConfigMismatchError, UnknownTopicError
from log_store.kafka.group_producer import PRODUCE_WINDOW
from log_store.kafka.log import KafkaLog, KafkaLogError, KafkaSettings
from log_store.partitioner import partition_for_key

pytestmark = pytest.mark.kafka


def _records(log: KafkaLog, topic: str, partitions: int) -> list[list[tuple[bytes | None, bytes | None]]]:
    out = []
    for p in range(partitions):
        got, offset = [], 0
        while batch := log.read(TopicPartition(topic, p), offset):
            got += [(r.key, r.value) for r in batch]
            offset = batch[-1].offset + 1
        out.append(got)
    return out


def test_records_land_on_the_embedded_logs_partitions_and_read_back_whole(kafka_bootstrap: str, kafka_prefix: str) -> None:
    settings = KafkaSettings(kafka_bootstrap, kafka_prefix)
    topic = f"{kafka_prefix}.public.t"
    keys = [b'{"id":%d}' % i for i in range(300)]
    with KafkaLog.open(settings, writer=True) as log:
        assert log.latest_watermark() is None
        log.ensure_topic(topic, 3)
        log.ensure_topic(topic, 3)  # the same settings again: nothing to do
        first = log.append_group(
            [ProducerRecord(topic, k, b"v" + k, 7, (("unchanged", b'["a"]'),)) for k in keys[:200]], "00000000000000AA"
        )
        second = log.append_group([ProducerColumns(topic, pa.array(keys[200:]), pa.array([b"w"] * 100), 8)], "00000000000000BB")
        assert second.sequence == first.sequence + 1
        with pytest.raises(TopicConfigMismatchError, match="partitions=3, not 4"):
            log.ensure_topic(topic, 4)
        with pytest.raises(TopicConfigMismatchError, match="cleanup.policy='compact', not 'delete'"):
            log.ensure_topic(topic, 3, compacted=False)
        with pytest.raises(InvalidRecordError, match="no key"):
            log.append_group(
                [ProducerRecord(topic, b'{"id":1}', b"x", 1), ProducerRecord(topic, None, b"x", 1)], "00000000000000CC"
            )
        with pytest.raises(UnknownTopicError):
            log.append_group([ProducerRecord(f"{kafka_prefix}.nope", b"k", b"x", 1)], "00000000000000CC")
    with KafkaLog.open(settings) as reader:
        latest = reader.latest_watermark()
        assert latest is not None and latest.position == "00000000000000BB"  # refused groups left nothing
        assert reader.topics() == [topic]
        by_partition = _records(reader, topic, 3)
        for p, records in enumerate(by_partition):
            expected = [(k, b"v" + k) for k in keys[:200] if partition_for_key(k, 3) == p]
            expected += [(k, b"w") for k in keys[200:] if partition_for_key(k, 3) == p]
            assert records == expected
            assert reader.end_offset(TopicPartition(topic, p)) == latest.end_offset(TopicPartition(topic, p))
        record = reader.read(TopicPartition(topic, partition_for_key(keys[0], 3)), 0, max_records=1)[0]
        assert (record.key, record.timestamp_ms, record.headers) == (keys[0], 7, (("unchanged", b'["a"]'),))
        with pytest.raises(ReadOnlyError):
            reader.ensure_topic(f"{kafka_prefix}.other", 1)


_KILLED_WRITER = """
import sys, time
from log_store import ProducerRecord
from log_store.kafka.group_producer import PRODUCE_WINDOW
from log_store.kafka.log import KafkaLog, KafkaSettings
log = KafkaLog.open(KafkaSettings(sys.argv[1], sys.argv[2]), writer=True)
def records():
    for i in range(PRODUCE_WINDOW):  # a whole chunk: produced and delivered before the next is asked for
        yield ProducerRecord(sys.argv[3], b'{"id":%d}' % i, b"torn", 1)
    print("produced", flush=True)  # every record of the chunk is in the broker, uncommitted
    time.sleep(600)
    yield from ()
log.append_group(records(), "00000000000000FF")
"""


def test_a_group_cut_by_kill_9_is_never_read_and_the_next_writer_follows_the_last_watermark(
    kafka_bootstrap: str, kafka_prefix: str, tmp_path: Path
) -> None:
    settings = KafkaSettings(kafka_bootstrap, kafka_prefix)
    topic = f"{kafka_prefix}.public.t"
    with KafkaLog.open(settings, writer=True) as log:
        log.ensure_topic(topic, 2)
        log.append_group([ProducerRecord(topic, b'{"id":%d}' % i, b"kept", 1) for i in range(10)], "0000000000000010")
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(_KILLED_WRITER))
    writer = subprocess.Popen(
        [sys.executable, str(script), kafka_bootstrap, kafka_prefix, topic],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "produced"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    with KafkaLog.open(settings, writer=True) as log:  # fences the dead writer and aborts its open transaction
        assert log.latest_watermark().position == "0000000000000010"  # type: ignore[union-attr]
        log.append_group([ProducerRecord(topic, b'{"id":%d}' % i, b"next", 1) for i in range(10)], "0000000000000020")
    with KafkaLog.open(settings) as reader:
        values = [value for partition in _records(reader, topic, 2) for _, value in partition]
        assert sorted(values) == [b"kept"] * 10 + [b"next"] * 10  # nothing of the torn records
        ends = [reader.end_offset(TopicPartition(topic, p)) for p in range(2)]
        assert sum(ends) > PRODUCE_WINDOW + 20  # the torn records took offsets: reads stepped over them


def test_a_second_writer_fences_the_first(kafka_bootstrap: str, kafka_prefix: str) -> None:
    settings = KafkaSettings(kafka_bootstrap, kafka_prefix)
    topic = f"{kafka_prefix}.public.t"
    with KafkaLog.open(settings, writer=True) as zombie:
        zombie.ensure_topic(topic, 1)
        zombie.append_group([ProducerRecord(topic, b"1", b"a", 1)], "0000000000000001")
        with KafkaLog.open(settings, writer=True) as successor:
            with pytest.raises(KafkaLogError, match="another writer"):
                zombie.append_group([ProducerRecord(topic, b"2", b"zombie", 1)], "0000000000000002")
            successor.append_group([ProducerRecord(topic, b"3", b"b", 1)], "0000000000000003")
    with KafkaLog.open(settings) as reader:
        assert [value for _, value in _records(reader, topic, 1)[0]] == [b"a", b"b"]
        assert reader.latest_watermark().position == "0000000000000003"  # type: ignore[union-attr]

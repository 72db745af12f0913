"""The log kept in Apache Kafka instead of on local disk: the same topics, records, placement and
watermarks as the embedded log, behind the same interface (:class:`log_store.log.Log`).

:mod:`log_store.kafka.log` is the log itself (:class:`~log_store.kafka.log.KafkaLog`: transactional
groups, read-committed reads that stop at a watermark), over its topics (:mod:`log_store.kafka.topics`),
its producer (:mod:`log_store.kafka.group_producer`) and its reads (:mod:`log_store.kafka.committed_reads`);
:mod:`log_store.kafka.client` is how it reaches
the brokers (:class:`~log_store.kafka.client.KafkaSettings`) and the one error every failure becomes.
It needs a Kafka cluster and the ``confluent-kafka`` client; the embedded log needs neither.
"""

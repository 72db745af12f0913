"""The log kept in Apache Kafka instead of on local disk: the same topics, records, placement and
watermarks as the embedded log, behind the same interface (:class:`log_store.log.Log`).

:mod:`log_store.kafka.log` is the log itself (:class:`~log_store.kafka.log.KafkaLog`: transactional
groups, read-committed reads that stop at a watermark); :mod:`log_store.kafka.client` is how it reaches
the brokers (:class:`~log_store.kafka.client.KafkaSettings`) and the one error every failure becomes.
It needs a Kafka cluster and the ``confluent-kafka`` client; the embedded log needs neither.
"""

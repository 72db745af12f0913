"""Reading the change log: where it lives (embedded directory or Kafka), the log as of a step's watermark,
the ``cdclog`` Spark data source, Spark's Kafka source, key splits, and a table's pending events read,
reduced and typed for one step.

The only layer that knows where the log lives. Above :mod:`derived_views.events`, below
:mod:`derived_views.write`.
"""

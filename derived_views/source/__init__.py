"""Reading the change log: where it lives (embedded directory or Kafka), the log as of a step's watermark,
its records read by input partition, the ``cdclog`` Spark data source, Spark's Kafka source, key splits,
a table's step in a sync as one value (:class:`~derived_views.source.table_step.TableStep`), and a table's
pending events read, reduced and typed for one step.

The only layer that knows where the log lives. Above :mod:`derived_views.events`, below
:mod:`derived_views.write`.
"""

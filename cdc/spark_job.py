"""Entry point for ``spark-submit``: the same commands as ``cdc`` (``sync``, ``rebuild``, ``verify``, ...).

Example (docs/scaling.md: what the executors need, and ``--jars`` instead of ``--packages`` offline)::

    PYSPARK_PYTHON=/opt/cdc/.venv/bin/python spark-submit --master spark://master:7077 \\
        --packages io.delta:delta-spark_4.2_2.13:4.4.0,org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 \\
        cdc/spark_job.py sync warehouse --once

:func:`derived_views.engine.spark_session.build_spark` then keeps the master, jars and settings spark-submit gave
the driver, sets every view session's settings (:data:`derived_views.engine.spark_session.SESSION_DEFAULTS`:
Delta, timestamps written in microseconds, ...), and stops with one error when the driver lacks Delta
Lake. The executors run ``PYSPARK_PYTHON``, an environment with the project installed (the ``cdclog``
source runs there).
"""

from __future__ import annotations

from cdc.cli import main

if __name__ == "__main__":
    main()

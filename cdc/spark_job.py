"""Entry point for ``spark-submit``: the same commands as ``cdc`` (``sync``, ``rebuild``, ``verify``, ...).

Example (on a cluster, with the Delta package matching the installed ``delta-spark``)::

    spark-submit --master yarn --packages io.delta:delta-spark_4.2_2.13:4.4.0 \\
        cdc/spark_job.py sync warehouse --once

:func:`derived_views.spark_session.build_spark` then leaves the master and jars to ``spark-submit`` and
sets every view session's settings (:data:`derived_views.spark_session.SESSION_DEFAULTS`: Delta,
timestamps written in microseconds, ...).
The project must be installed on the executors too (the ``cdclog`` source runs there).
"""

from __future__ import annotations

from cdc.cli import main

if __name__ == "__main__":
    main()

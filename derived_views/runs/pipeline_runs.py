"""Spark Declarative Pipelines runs that read the ``cdclog`` source end with the run's own outcome.

``spark-pipelines`` sends a run to a Spark Connect server and reads the run's events back from one
command's response stream. When Python workers ran during the command (the ``cdclog`` source is a Python
data source: its reads are planned by Python workers on the server), the server adds, after the
events, the workers' accumulator updates as an observed-metrics response. pyspark 4.2's client
processes that response (profiler updates, which a run does not collect) and then hands it to the
command iterator the CLI reads events from, which raises ``UNKNOWN_RESPONSE`` on it: a run that
completed exits 1 with a traceback, whatever its flows did.

:func:`accept_metrics_in_runs` makes that iterator pass metrics responses over (the client has already
processed them) and leaves every other response, and every error, as it was. A pipeline's definitions
file calls it, since the definitions are imported in the CLI's process before the run starts; it
changes nothing in a process that never runs a pipeline.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

_ACCEPTING = "_cdc_accepts_metrics_in_runs"


def accept_metrics_in_runs() -> None:
    """Make the Spark Connect client's command iterator skip metrics responses (idempotent); see the
    module docstring."""
    from pyspark.errors import PySparkValueError
    from pyspark.sql.connect.client.core import PlanMetrics, PlanObservedMetrics, SparkConnectClient

    if getattr(SparkConnectClient, _ACCEPTING, False):
        return

    def execute_command_as_iterator(self: Any, command: Any, observations: Any = None) -> Iterator[dict[str, Any]]:
        """pyspark 4.2's method, which yields every response that is a dict (the run's events), with
        metrics responses passed over instead of raised on."""
        request = self._execute_plan_request_with_metadata()
        if self._user_id:
            request.user_context.user_id = self._user_id
        self._set_command_in_plan(request.plan, command)
        for response in self._execute_and_fetch_as_iterator(request, observations or {}):
            if isinstance(response, dict):
                yield response
            elif not isinstance(response, PlanMetrics | PlanObservedMetrics):
                raise PySparkValueError(errorClass="UNKNOWN_RESPONSE", messageParameters={"response": str(response)})

    SparkConnectClient.execute_command_as_iterator = execute_command_as_iterator  # type: ignore[method-assign]
    setattr(SparkConnectClient, _ACCEPTING, True)

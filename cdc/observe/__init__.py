"""Watching the pipeline: how far behind each stage is (``cdc lag`` and its Prometheus exporter), the
metrics of the capture and sync processes, the slot's health, the reads under way, and structured log
lines.

May import ``cdc.errors``, ``cdc.capture``, ``cdc.config`` and ``cdc.setup`` (the failover facts of the
source); never ``cdc.run`` or the command line.
"""

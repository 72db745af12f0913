"""Throwaway local servers: PostgreSQL (Debian's, or a pinned build of any supported version) and a Kafka
broker from its jars, each started as an unprivileged process on loopback ports and removed afterwards.

They serve ``cdc demo``, the tests and the benchmarks, and ``scripts/setup`` fetches what they run
(:func:`local_servers.kafka.fetch`, ``python -m local_servers.pg_builds``). Neither capture nor the views
import them: the product runs against the user's own servers. They import no product package either
(``cdc``, ``derived_views``): their failures are their own plain exceptions, and what they need of Spark
(the Kafka broker's jars resolved) is handed to them.
"""

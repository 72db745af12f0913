"""The application's configuration: the settings read from ``CDC_*`` variables (:mod:`cdc.config.settings`),
the warning for an unknown name, and what the settings are turned into: the log the pipeline uses, the
data directory kept to its owner, the views' plain arguments, and connection URLs with their passwords
hidden.

May import ``cdc.errors``, ``cdc.capture``, ``log_store``, ``event_format`` and ``derived_views``' entry
point; never ``cdc.setup``, ``cdc.observe``, ``cdc.run`` or the command line.
"""

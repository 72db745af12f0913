"""What ``cdc setup`` (and capture, before it makes a slot) checks of the source and creates on it: the
prerequisites, the publication and the slot, declared capture rules and column masks, failover slots,
capture from a hot standby, and the project's Alembic migrations.

May import ``cdc.errors``, ``cdc.capture`` and ``cdc.config``; never ``cdc.observe``, ``cdc.run`` or the
command line.
"""

"""Change events as the views see them: envelopes decoded and reduced per key, source columns and their
faithful Spark types, stored column names, and a batch typed (by Arrow or by Spark) with its facts.

Pure logic over rows and Arrow tables: it does not read the log or start Spark (functions that type a
DataFrame take one). Above :mod:`derived_views.engine`, below :mod:`derived_views.source`.
"""

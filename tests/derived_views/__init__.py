"""Tests of :mod:`derived_views`, laid out as the package is: a module's tests are at the same path here.

- each layer's own tests are in the folder of its name (``engine/``, ``events/``, ``source/``, ``write/``,
  ``views/``, ``runs/``), ``test_<module>.py`` for one module where there is one (an end-to-end test of
  one module's concern, such as ``events/test_case_only_names.py``, sits with that module's layer);
- the test files at this level are end-to-end tests across the layers (PostgreSQL -> capture -> log ->
  Spark -> Delta -> verify: exactness through DDL and edge values, every PostgreSQL version, Kafka, a
  Spark cluster, a table read again, publication rules and masks, any table names), and the tests of
  the modules at the package's root (``test_definitions.py`` for :mod:`derived_views.definitions`);
- the shared fixtures and helpers stay here: ``conftest.py`` (fixtures), ``pipeline.py`` (the whole
  pipeline in one test process) and ``log_builder.py`` (a change log built by hand).
"""

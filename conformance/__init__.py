"""The kvconform conformance suite: ``pytest --pyargs kvconform.conformance --backend NAME``.

| role | where | what it holds |
|---|---|---|
| checks | ``test_*.py`` (here) | one module per check family; each test reads as the property it verifies |
| harness | ``harness/`` | what checks are written with: the case, guarded arenas, exact data, strategies, reference twins of the ops, assertion helpers, and ``applicability`` (the one place that decides *not applicable*) |
| plugin | ``plugin/`` | the pytest plugin: options and session, collection, the typed record per test, the one verdict function, recording and the outputs |

docs/ARCHITECTURE.md walks the path of one verdict through these files.
"""

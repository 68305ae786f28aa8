"""Stands in for hypothesis in the processes the tests and the benchmarks start (servers,
the framing ceiling, commands, Spark's Python workers), put first on their ``PYTHONPATH``
by ``ops.testing.serverproc.without_hypothesis`` (``tests/conftest.py`` does it for every
process of a test session).

kio imports hypothesis whenever it can, to register strategies for its types. That costs a
process twice:

- hypothesis imports pytest in turn, which cost every ``pidctl`` process the tests start
  about 0.3 s of CPU (and a second of wall time on a busy machine) before it did anything;
- hypothesis runs its plugins, and trio's makes trio's scheduler deterministic for tests: it
  sorts and shuffles every batch of ready tasks, a cost on every pass of the event loop
  that a benchmark would measure (5 % of the framing ceiling's instructions per request at
  16 connections x 1 in flight, 1 % of pidctl's).

None of those processes uses hypothesis, and an installed pidctl does not have it: this
makes them start and schedule as they do in production.
"""

raise ImportError("hypothesis is left out of the processes the tests start")

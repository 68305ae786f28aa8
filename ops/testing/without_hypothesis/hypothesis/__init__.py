"""Stands in for hypothesis in the processes the tests start (servers, commands, Spark's
Python workers), put first on their ``PYTHONPATH`` by ``tests/conftest.py``.

kio imports hypothesis whenever it can, to register strategies for its types; hypothesis
imports pytest in turn, which cost every ``pidctl`` process the tests start about 0.3 s of
CPU (and a second of wall time on a busy machine) before it did anything. None of those
processes uses hypothesis, and an installed pidctl does not have it: this makes them start
as they do in production.
"""

raise ImportError("hypothesis is left out of the processes the tests start")

"""Which Python a local session's workers run.

PySpark starts its Python workers with ``PYSPARK_PYTHON``, else ``python3`` from ``PATH``,
whatever interpreter runs the driver. So ``.venv/bin/python example.py`` on a local session
runs the tasks with the system's ``python3``, where pidctl (and often pyspark) is not
installed, and every task fails with ``ModuleNotFoundError: No module named 'pidctl'``. In a
local session the workers run on this machine, so the interpreter running the driver is the
right one; on a cluster it is not (docs/spark-deployment.md), and nothing is changed there.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def use_this_python_locally(spark: Any) -> None:
    """In a local session (``local``, ``local[N]``, ...) where neither ``PYSPARK_PYTHON`` nor
    ``spark.pyspark.python`` says which Python the workers run, run them with this one
    (``sys.executable``). Functions made after this call (data sources registered, mapped
    batches) carry it to their workers. Anything set explicitly is left as it is."""
    context = spark.sparkContext
    if not str(context.master).startswith("local"):
        return
    if os.environ.get("PYSPARK_PYTHON") or context.getConf().get("spark.pyspark.python"):
        return
    context.pythonExec = sys.executable

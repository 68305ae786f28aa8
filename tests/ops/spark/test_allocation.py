"""The driver hook against a real `pidctl serve`, and its columns in a real SparkSession."""

from __future__ import annotations

import re
import threading
import urllib.request
from typing import Any

import pytest

from ops.testing.serverproc import ServerProcess
from pidctl.controller.core.records import ProducerIdsGranted
from pidctl.controller.log.recovery import read_log
from pidctl.spark import (
    JobAllocation,
    PreallocationError,
    preallocate_producer_ids,
    with_producer_columns,
)
from pidctl.spark.allocation import allocate_job_blocks


def _requests(server: ServerProcess, api: str) -> float:
    with urllib.request.urlopen(server.metrics_url + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    pattern = rf'^pidctl_requests_total\{{api="{api}",version="\d+"\}} (\S+)$'
    return sum(float(n) for n in re.findall(pattern, text, re.MULTILINE))


def _job_blocks(server: ServerProcess, client_id: str) -> list[tuple[int, int]]:
    return [
        (e.record.first_producer_id, e.record.next_producer_id)
        for e in read_log(server.data_dir).entries()
        if isinstance(e.record, ProducerIdsGranted)
        and e.record.holder == "job"
        and e.record.client_id == client_id
    ]


def test_allocation_maps_partitions_across_blocks() -> None:
    allocation = JobAllocation("app", ((5000, 1000), (9000, 1000)))
    assert allocation.size == 2000
    assert allocation.producer(0) == (5000, 0)
    assert allocation.producer(999) == (5999, 0)
    assert allocation.producer(1000) == (9000, 0)
    with pytest.raises(IndexError, match="beyond the 2000 producer ids preallocated for app"):
        allocation.producer_id(2000)


def test_preallocating_n_ids_makes_ceil_n_over_1000_requests_and_no_init(
    spark: Any, pidctl: ServerProcess
) -> None:
    inits_before = _requests(pidctl, "init_producer_id")
    blocks = len(_job_blocks(pidctl, spark.sparkContext.applicationId))
    for count, requests in ((1, 1), (1000, 1), (1001, 2), (2500, 3)):
        before = _requests(pidctl, "allocate_producer_ids")
        allocation = preallocate_producer_ids(spark, bootstrap=pidctl.bootstrap, count=count)
        assert _requests(pidctl, "allocate_producer_ids") - before == requests
        assert allocation.size == 1000 * requests
        blocks += requests
        assert len(_job_blocks(pidctl, allocation.client_id)) == blocks
    assert _requests(pidctl, "init_producer_id") == inits_before


def test_a_job_takes_every_partitions_ids_from_its_blocks_and_asks_nothing(
    spark: Any, pidctl: ServerProcess
) -> None:
    """Executors make no request at all. (How a partition past the first block maps into the
    second is the allocation's own arithmetic, tested above without a job: a job of 1,001
    partitions took 80 s of CI.)"""
    partitions = 48
    allocation = preallocate_producer_ids(spark, bootstrap=pidctl.bootstrap, count=partitions)
    assert allocation.client_id == spark.sparkContext.applicationId
    allocations_before = _requests(pidctl, "allocate_producer_ids")
    inits_before = _requests(pidctl, "init_producer_id")
    df = with_producer_columns(spark.range(0, 2 * partitions, 1, partitions), allocation)
    rows = df.collect()
    assert len(rows) == 2 * partitions
    assert _requests(pidctl, "allocate_producer_ids") == allocations_before
    assert _requests(pidctl, "init_producer_id") == inits_before
    by_partition: dict[int, set[tuple[int, int]]] = {}
    for row in rows:  # spark.range puts ids 2p and 2p+1 in partition p
        by_partition.setdefault(row.id // 2, set()).add((row.producer_id, row.producer_epoch))
        assert row.sequence == row.id % 2
    pids = [next(iter(v))[0] for _, v in sorted(by_partition.items())]
    assert all(len(v) == 1 for v in by_partition.values())
    assert len(set(pids)) == partitions
    logged = _job_blocks(pidctl, allocation.client_id)
    assert all(any(first <= pid < end for first, end in logged) for pid in pids)


def test_retried_attempts_reproduce_the_same_triples(spark: Any, pidctl: ServerProcess) -> None:
    allocation = preallocate_producer_ids(spark, bootstrap=pidctl.bootstrap, count=8)

    def fail_first_attempts(batches: Any) -> Any:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        for i, batch in enumerate(batches):
            if context.attemptNumber() == 0 and context.partitionId() % 2 == 0 and i == 1:
                raise RuntimeError("injected failure of a first attempt")
            yield batch

    source = spark.range(0, 8000, 1, 8)
    once = with_producer_columns(source, allocation).collect()
    failing = source.mapInArrow(fail_first_attempts, source.schema)
    # maxRecordsPerBatch small, so a failing attempt has yielded part of its output.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        again = with_producer_columns(failing, allocation).collect()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    triples = sorted((r.id, r.producer_id, r.producer_epoch, r.sequence) for r in once)
    assert sorted((r.id, r.producer_id, r.producer_epoch, r.sequence) for r in again) == triples


def test_two_concurrent_jobs_never_share_a_producer_id(pidctl: ServerProcess) -> None:
    results: dict[str, JobAllocation] = {}

    def job(name: str) -> None:
        results[name] = allocate_job_blocks(pidctl.bootstrap, 20_000, name)

    threads = [threading.Thread(target=job, args=(f"job-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a, b = (
        set(range(r.size)) and {r.producer_id(i) for i in range(r.size)} for r in results.values()
    )
    assert len(a) == len(b) == 20_000 and not a & b
    for name, allocation in results.items():
        assert sorted(allocation.blocks) == [(f, e - f) for f, e in _job_blocks(pidctl, name)]


def test_refusals_are_clear(tmp_path: Any) -> None:
    acl_server = ServerProcess(tmp_path / "d", "--authorizer", "acl", "--super-users", "User:admin")
    refused = pytest.raises(PreallocationError, match="refused a block for app: cluster_auth")
    with acl_server, refused:
        allocate_job_blocks(acl_server.bootstrap, 10, "app")
    with pytest.raises(PreallocationError, match=r"pidctl at 127\.0\.0\.1:1"):
        allocate_job_blocks("127.0.0.1:1", 10, "app")

"""The benchmark tools work (not how fast: figures live in ops/bench, never in tests)."""

from __future__ import annotations

import json
import urllib.request
from functools import partial
from pathlib import Path

import pytest
import trio

from ops.bench import faults, loadgen, profile, suite
from ops.bench.ceiling import canned_responses
from ops.bench.suite import chart
from ops.testing.serverproc import ServerProcess
from pidctl.protocol.apis import ApiKey


@pytest.mark.parametrize("scenario", loadgen.SCENARIOS)
def test_load_generator_scenarios(server: ServerProcess, scenario: str) -> None:
    result = trio.run(loadgen.run, server.bootstrap, scenario, 2, 2, 0.3)
    assert result["requests"] > 0 and result["p50_ms"] <= result["p99_ms"]


def test_load_generator_fails_on_an_unexpected_error(server: ServerProcess) -> None:
    # AllocateProducerIds from a broker never registered: the controller refuses each one
    # (a registered broker's new incarnation is no longer refused, as in Kafka).
    unregistered = 77_000
    with pytest.raises(ExceptionGroup) as raised:  # from the connection's task
        trio.run(
            partial(loadgen.run, broker_base=unregistered, register=False),
            server.bootstrap,
            "allocate",
            1,
            1,
            0.1,
        )
    assert raised.group_contains(RuntimeError, match="unexpected error.*stale_broker_epoch")


def test_storm(server: ServerProcess) -> None:
    result = trio.run(loadgen.storm, server.bootstrap, 200, 0.2, 30.0)
    assert result["served"] == 200 and result["last_served_s"] < 30


def test_storm_asks_api_versions_first(server: ServerProcess) -> None:
    # Every producer's ApiVersions is answered (and counted by the server) before its PID.
    trio.run(loadgen.storm, server.bootstrap, 20, 0.1, 30.0)
    with urllib.request.urlopen(server.metrics_url + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    assert 'pidctl_requests_total{api="api_versions",version="3"} 20.0' in text
    assert 'pidctl_requests_total{api="init_producer_id",version="5"} 20.0' in text


def test_the_ceiling_answers_every_version_of_its_apis() -> None:
    keys = canned_responses()
    assert len(keys) == 5 + 6 + 1
    for (api_key, version), (before, after) in (
        ((ApiKey.API_VERSIONS, 3), keys[b"\x00\x12\x00\x03"]),
        ((ApiKey.INIT_PRODUCER_ID, 5), keys[b"\x00\x16\x00\x05"]),
    ):
        assert int.from_bytes(before, "big") == 4 + len(after), (api_key, version)


@pytest.mark.slow
def test_suite_short_mode_reports_every_ratio_row(tmp_path: Path) -> None:
    # The rows of issue 17 in the short mode: each with a ratio to its baseline and a chart;
    # the throughput rows measured in 3 rounds, the median ratio of the rounds whose ceiling
    # was saturated reported (on a busy machine possibly none: the row is client-bound).
    only = ",".join(suite.RATIO_ROWS)
    results = suite.main(["--short", "--rounds", "3", "--only", only, "--out", str(tmp_path)])
    written = json.loads((tmp_path / "results.json").read_text())
    assert written == json.loads(json.dumps(results))
    by_group = {row["group"]: row for row in written["rows"]}
    for name in ("storm", "memory-per-transactional-id"):
        assert by_group[name]["ratio"] > 0, name
    memory = by_group["memory-per-transactional-id"]
    assert memory["peak_bytes_per_id"] >= memory["bytes_per_id"] > 0
    for name in suite.RATIO_ROWS[:5]:
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name
    storm = by_group["storm"]
    assert storm["served"] == 200 and storm["server_cpu_s"] > 0
    storm_rounds = sorted(float(r) for r in storm["rounds"].split())  # 3 alternated pairs
    assert len(storm_rounds) == 3 and round(storm["ratio"], 2) == storm_rounds[1]
    fixed_answers = [r for r in written["rows"] if r["name"].startswith("fixed ")]
    assert len(fixed_answers) == 4
    for name, ceiling in zip(suite.RATIO_ROWS[:4], fixed_answers, strict=True):
        row = by_group[name]
        rounds = row["rounds"].split()
        counted = sorted(float(r) for r in rounds if not r.endswith("(client-bound)"))
        assert len(rounds) == 3 and row["rounds_counted"] == len(counted), name
        if counted:
            assert round(row["ratio"], 2) == counted[len(counted) // 2], name
            assert ceiling["server_cpu_share"] >= suite.SATURATED_CORE_SHARE, name
        else:
            assert row["ratio"] is None and row["client_bound"], name
            assert ceiling["server_cpu_share"] < suite.SATURATED_CORE_SHARE, name
            assert row["why"].startswith("client-bound"), name
            assert f"other work on the machine {ceiling['others_cores']:.2f}" in row["why"], name
        # Beside the latencies: how long the machine stopped everything (the stall probe),
        # both servers' CPU per request and share of a core, the load generator's share.
        assert row["stalled_ms_per_s"] >= 0, name
        assert row["server_cpu_us_per_request"] > 0, name
        assert row["cpu_per_request_ratio"] > 0, name
        assert row["others_cores"] >= 0 and ceiling["others_cores"] >= 0, name
        assert row["server_cpu_share"] > 0 and row["loadgen_cpu_share"] > 0, name
        assert ceiling["longest_stall_ms"] >= 0 and ceiling["server_cpu_share"] > 0, name


def test_suite_refuses_an_unknown_row(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        suite.main(["--only", "idempotent-16x1,nonsense"])
    assert "unknown row nonsense; rows: idempotent-16x1," in capsys.readouterr().err


def test_chart(tmp_path: Path) -> None:
    rows = [
        {"group": "ceiling", "name": "x", "per_second": 10.0},
        {"group": "grants", "name": "y", "per_second": 5.0},
    ]
    chart(rows, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


#: The small campaign's cycles: SIGKILLs, I/O faults, bit flips (each with named jobs of
#: three principals), counter regressions.
KILLS, FAULTS, FLIPS, REGRESSIONS = 2, 2, 2, 1


@pytest.mark.slow
def test_a_small_fault_campaign_finds_nothing_lost(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--kills", str(KILLS), "--faults", str(FAULTS), "--flips", str(FLIPS)]
    argv += ["--regressions", str(REGRESSIONS)]
    assert faults.main([*argv, "--episode", "7", "--seed", "3"]) == 0
    result = json.loads(capsys.readouterr().out)
    # A flip cycle is a SIGKILL too, then a bit of the newest record flipped; a kill just
    # after a roll leaves no whole record in the active segment, and the flip is tried again.
    flips = result["bits_flipped"] + result["flips_not_reached"]
    assert result["kills"] == KILLS + flips
    assert result["bits_flipped"] >= 1 and flips >= FLIPS
    assert result["grants_checked"] >= result["grants_acknowledged"] > 0
    # Named jobs of several principals ran through it, each checked: recorded for its
    # owner, re-runs answered the same blocks or refused, another principal refused.
    assert result["job_blocks_acknowledged"] > 0 and result["job_problems"] == 0
    # A fault not reached in time is tried again (at most as often as faults were asked for).
    assert result["faults_injected"] >= 1
    assert result["faults_injected"] + result["faults_not_reached"] >= FAULTS
    # Two controllers on one etcd, checked apart.
    assert result["counter_regressions"] == REGRESSIONS


def test_profile_summary_of_py_spy_raw_stacks() -> None:
    raw = (
        "thread (1): MainThread;run (trio/_run.py);handle (controller/api/handlers.py) 6\n"
        "thread (1): MainThread;run (trio/_run.py);encode (protocol/codec.py) 2\n"
        "thread (1): MainThread;run (trio/_run.py) 4\n"
        "thread (2): Trio thread 0;_work (trio/_thread_cache.py) 8\n"
    )
    summary = profile.summarise(raw, top=2).splitlines()
    assert summary[0] == "thread (1): MainThread: 12 samples (60% of all)"
    # The two functions with most samples of their own, with the share they are on the stack.
    assert summary[2].split() == ["50.0%", "50.0%", "handle", "(controller/api/handlers.py)"]
    assert summary[3].split() == ["33.3%", "100.0%", "run", "(trio/_run.py)"]
    assert summary[4] == "thread (2): Trio thread 0: 8 samples (40% of all)"

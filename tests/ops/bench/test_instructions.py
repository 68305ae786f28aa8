"""The instruction-count benchmark runs: pidctl and the ceiling under callgrind, loaded by the
compiled generator, each giving a count per request (what the counts are is for ops/bench,
never for tests), and nothing left behind."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from ops.bench import instructions


@pytest.mark.slow
def test_a_row_counts_both_servers_instructions_per_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where its data dirs go
    keep = tmp_path / "kept"
    [figures] = instructions.main(["idempotent-16x1", "--seconds", "0.5", "--keep", str(keep)])

    assert figures["row"] == "idempotent-16x1"
    [kept] = keep.iterdir()
    for server in ("ceiling", "pidctl"):
        measured = figures[server]
        short, long = measured["requests"]
        assert 0 < short < long, server  # the long window answered more
        assert measured["instructions_per_request"] > 0, server
        # Each window's dump holds what was counted (the collector's share apart).
        dumps = [kept / server / f"callgrind.out.{n}" for n in (1, 2)]
        counts = [instructions.profile_totals(dump) for dump in dumps]
        assert [total for total, _ in counts] == measured["instructions"], server
        assert [gc for _, gc in counts] == measured["gc_instructions"], server
    assert figures["ratio"] == pytest.approx(
        figures["ceiling"]["instructions_per_request"]
        / figures["pidctl"]["instructions_per_request"]
    )
    build, line = capsys.readouterr().out.splitlines()
    assert build.startswith("pidctl: ")  # which build it measured
    assert line.startswith("idempotent-16x1") and "ratio" in line
    assert not list(kept.rglob("*.log"))  # the data dir is not kept
    # Its temporary directory (the servers' data) is gone.
    assert sorted(tmp_path.iterdir()) == [keep]


def test_an_unknown_row_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        instructions.main(["idempotent-16x1", "nonsense"])
    assert exited.value.code == 2
    assert "unknown row nonsense" in capsys.readouterr().err


def test_live_counts_are_summed_over_threads_and_zero_before_any_ran() -> None:
    shown = "PID 7: python -m ops.bench.ceiling\n\n  Totals:    Ir \n   Th 1  1,042,800 \n"
    assert instructions.counted(shown + "   Th 2  57,502 \n") == 1_100_302
    assert instructions.counted("PID 7: python\n\n  Totals:Ir \n") == 0
    with pytest.raises(RuntimeError, match="no totals"):
        instructions.counted("PID 7: python\n  No information available\n")


ANNOTATED = """\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
219,639,790 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                   file:function
--------------------------------------------------------------------------------
 90,360,296 (41.14%)  Python/ceval.c:_PyEval_EvalFrameDefault'2 [libpython3.11.so.1.0]
 28,195,890 (12.84%)  Modules/gcmodule.c:gc_collect_main [libpython3.11.so.1.0]
  1,000,000 ( 0.46%)  Modules/gcmodule.c:gc_collect_main'2 [libpython3.11.so.1.0]
  6,280,476 ( 2.86%)  Objects/dictobject.c:dict_traverse [libpython3.11.so.1.0]
"""


def test_a_dumps_totals_and_its_collectors_share_once() -> None:
    # (A recursive call's line, "'2", is inside the outer call's inclusive count.)
    assert instructions.annotated_totals(ANNOTATED) == (219_639_790, 28_195_890)
    no_gc = "\n".join(line for line in ANNOTATED.splitlines() if "gc_collect" not in line)
    assert instructions.annotated_totals(no_gc) == (219_639_790, 0)
    with pytest.raises(RuntimeError, match="no program totals"):
        instructions.annotated_totals(ANNOTATED.replace("PROGRAM TOTALS", ""))

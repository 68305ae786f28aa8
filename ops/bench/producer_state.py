"""Memory per tracked (producer, partition) in the broker-side sequence table.

    python -m ops.bench.producer_state [--producers 1000000]

Each scenario runs in a fresh process: it fills a ProducerStateTable with P producers, each
with N batches retained (every batch appended through the real ``append``), and reports the
growth of the resident set divided by P. The baseline, measured in the same run the same
way, is the obvious Python structure: a dict of producer id -> deque of (first sequence,
last sequence, offset) tuples. Kafka's Java structures need about 36 bytes per retained
batch (ProducerStateEntry's BatchMetadata), a figure quoted for reference, not measured.
N = 1000 with a million producers would need over 16 GB; it runs with fewer producers.
"""

from __future__ import annotations

import argparse
import collections
import json

from ops.bench.common import rss_kib, run_json


def _measure(kind: str, producers: int, retained: int) -> dict[str, float]:
    from pidctl.broker.sequences import ProducerStateTable

    before = rss_kib() * 1024
    keep: object
    if kind == "baseline":
        table: dict[int, collections.deque[tuple[int, int, int]]] = {}
        for pid in range(producers):
            batches: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=retained)
            for i in range(retained):
                batches.append((i, i, pid * retained + i))
            table[pid] = batches
        keep = table
    else:
        mode = "latest" if kind == "latest" else "batches"
        state = ProducerStateTable(max(5, retained), mode=mode)
        append = state.append
        for pid in range(producers):
            for i in range(retained):
                append(pid, 0, i, 1, pid * retained + i, 0)
        keep = state
    used = rss_kib() * 1024 - before
    del keep
    return {"bytes_per_producer": used / producers, "bytes_per_batch": used / producers / retained}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--producers", type=int, default=1_000_000)
    parser.add_argument("--producers-n1000", type=int, default=20_000)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, producers, retained = args.child
        print(json.dumps(_measure(kind, int(producers), int(retained))))
        return
    scenarios = [
        ("baseline: dict of deques of tuples, N=5", "baseline", args.producers, 5),
        ("pidctl, N=5", "batches", args.producers, 5),
        ("pidctl, N=20", "batches", args.producers, 20),
        ("pidctl, N=1000", "batches", args.producers_n1000, 1000),
        ("pidctl, latest-sequence mode", "latest", args.producers, 1),
    ]
    results = []
    for name, kind, producers, retained in scenarios:
        measured = run_json(
            "ops.bench.producer_state", "--child", kind, str(producers), str(retained)
        )
        results.append((name, producers, retained, measured))
    baseline = results[0][3]["bytes_per_producer"]
    print(f"{'scenario':<42} {'producers':>10} {'B/producer':>11} {'B/batch':>8}  vs baseline")
    for name, producers, retained, r in results:
        ratio = r["bytes_per_producer"] / baseline if retained == 5 else float("nan")
        ratio_text = f"{ratio:.2f}x" if retained == 5 else "-"
        print(
            f"{name:<42} {producers:>10,} {r['bytes_per_producer']:>11,.0f} "
            f"{r['bytes_per_batch']:>8,.1f}  {ratio_text}"
        )
    print("Kafka (Java, reference): ~36 B per retained batch")


if __name__ == "__main__":
    main()

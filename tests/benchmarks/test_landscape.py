"""The landscape summary of an exhaustive CSV (benchmarks/landscape.py) on a space whose times are
known: its counts agree with the CSV read directly."""

from __future__ import annotations

import csv
import statistics

from benchmarks.landscape import by_rank, landscape_lines
from cutetune.device.specs import DEVICE_SPECS
from testkit.known_exhaustive import write_known_exhaustive


def test_the_counts_and_spreads_are_the_csvs(tmp_path):
    path = write_known_exhaustive(tmp_path / "exhaustive.csv", ("qwen3-8b",), ["rmsnorm"],
                                  (8, 4096))
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    by_bucket: dict[tuple, list[float]] = {}
    for r in rows:
        by_bucket.setdefault((r["static_key"], int(r["bucket"])), []).append(
            float(r["median_us"]))
    near = [sum(us <= min(times) * 1.03 for us in times)
            for (_, bucket), times in by_bucket.items() if bucket <= 64]
    over = [statistics.median(times) / min(times)
            for (_, bucket), times in by_bucket.items() if bucket <= 512]
    lines = landscape_lines(path, DEVICE_SPECS["H200"])
    assert lines[0] == (f"buckets of 1-64 tokens: points within 3% of the best: median "
                        f"{statistics.median(near):g} (p10-p90 {by_rank(near, 0.1)}"
                        f"-{by_rank(near, 0.9)})")
    assert lines[1] == (f"buckets of 1-512 tokens: the median point over the best: "
                        f"{min(over):.2f}-{max(over):.2f}x")
    assert lines[2].endswith(f" of {len(by_bucket)} buckets")
    assert [line.split(":")[0] for line in lines[3:]] == ["rmsnorm"]
    assert by_rank([5, 1, 3, 2, 4], 0.1) == 1 and by_rank([5, 1, 3, 2, 4], 0.9) == 5

"""What the results database costs a tuning run per trial: the fault kernel's buckets tuned by
the real tuner (tune_model: claims, Optuna's RDB storage with heartbeats, the stored runs) with
the fake GPU worker answering at once, so that what is left is the tuner's own time, against
each database, and the same run with Optuna's studies in memory (the least a run does).

    python3 -m benchmarks.db_trial_overhead [--db URL ...] [--buckets 16] [--trials 2]
        [--out F.csv]

A SQLite file in a temporary directory is always measured; each --db (a PostgreSQL server's
URL, e.g. postgresql+psycopg://user:pw@127.0.0.1:5432/postgres) is measured in a schema of its
own, dropped afterwards. The artifact cache is filled by an untimed run first, and a run is
timed from its start (workers up) to its end. Needs no GPU: on a GPU machine it measures the
same database round trips a real run makes there.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time
from pathlib import Path

import optuna

from cutetune.results_db.session import shown_url
from testkit.databases import scratch_url
from testkit.fault_kernel import FAKE_TRIAL_SECONDS
from testkit.fault_run import Silent, run, sound_points_only

IN_MEMORY = "optuna in memory, results in a SQLite file"


class Clocked(Silent):
    def started(self, *args) -> None:
        self.at = time.perf_counter()


def timed(url: str, cache: Path, buckets: list[int], trials: int,
          studies_in_memory: bool = False) -> tuple[int, float]:
    """(trials run, seconds from the run's start to its end) of one run into `url`."""
    sound_points_only(url)
    clock = Clocked()
    storage = optuna.storages.InMemoryStorage() if studies_in_memory else None
    summaries = run(url, cache, trials, buckets, observer=clock, storage=storage)
    return sum(s.trials for s in summaries), time.perf_counter() - clock.at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", action="append", default=[],
                        help="a PostgreSQL server's URL to measure (a schema of its own)")
    parser.add_argument("--buckets", type=int, default=16, help="token buckets: 1, 2, 4, ...")
    parser.add_argument("--trials", type=int, default=2, help="trials per bucket (at most 3)")
    parser.add_argument("--out", default=None, help="CSV to write")
    args = parser.parse_args()
    os.environ[FAKE_TRIAL_SECONDS] = "0"
    buckets = [2 ** n for n in range(args.buckets)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="cutetune-db-overhead-") as directory:
        work = Path(directory)
        cache = work / "cache"
        timed(f"sqlite:///{work / 'warm.db'}", cache, buckets[:1], args.trials)
        cases = [(IN_MEMORY, "sqlite", None, True), ("sqlite", "sqlite", None, False)]
        cases += [(shown_url(url), "postgresql", url, False) for url in args.db]
        for name, backend, server, in_memory in cases:
            with scratch_url(backend, work, f"bench{len(rows)}", server) as url:
                trials, seconds = timed(url, cache, buckets, args.trials, in_memory)
            rows.append({"database": name, "buckets": len(buckets), "trials": trials,
                         "seconds": round(seconds, 2),
                         "ms_per_trial": round(1000 * seconds / trials, 1),
                         "ms_per_bucket": round(1000 * seconds / len(buckets), 1)})
    floor = rows[0]["ms_per_trial"]
    for row in rows:
        row["added_ms_per_trial"] = round(row["ms_per_trial"] - floor, 1)
    writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    if args.out:
        with open(args.out, "w", newline="") as handle:
            out = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
            out.writeheader()
            out.writerows(rows)


if __name__ == "__main__":
    main()

"""A warm start as an engine pays it: `import torch`, `import cutetune`, then
`cutetune.warmup(model)`, each start in a fresh process, the artifact cache warmed first by
another process; for every preset by default.

Each model gets a results DB (CUTETUNE_DB) holding a winner for every bucket (1..32768) of
every problem of every kernel it uses, each bucket a different point where the space has
enough (the roofline's ranked points, in turn), so that the warmup makes ready as many
distinct points as a fully tuned model could. A first fresh process warms the artifact cache:
its warmup compiles every point (in parallel processes), and its time is the cold start. That
process also writes the bytecode of everything it imports, as an installed package has it
(pip compiles it at install), where the environment says not to (PYTHONDONTWRITEBYTECODE, as
on the H200 machine): otherwise every warm start would compile cutetune's source again, which
no installed cutetune does. Then STARTS fresh processes each run

    t0; import torch; t1; import cutetune; t2; cutetune.warmup(MODEL); t3; cutetune.rmsnorm; t4

with nothing initialised before the warmup (CUDA included: the warmup's first question to
torch initialises it, as in an engine that warms up before it loads weights). The CSV has,
per model, the medians over the starts of `import torch`, `import cutetune` (its own import:
the dispatcher's modules and the ops are bound at first use), the warm warmup (and the
slowest), the first use of a public op after it (binding the ops: their modules and
torch.library registrations), the cold start, how many artifacts the cache held, and how many
modules of CuTeDSL, Optuna and SQLAlchemy the warm start imported (none: the artifacts load
without CuTeDSL, a SQLite database is read with sqlite3 alone, nothing of the search is
imported). One more fresh process times what the warmup's device fingerprint asks of CUDA
alone (initialising it, the device's properties): the part of a warm start that an engine
pays anyway and no library can save.

With CUTETUNE_WARMUP_PROFILE=1 each warm start also prints the 30 costliest calls of its
warmup (cProfile, cumulative) to stderr, shown here.

    python3 -m benchmarks.warmup_time --out OUT.csv [--starts 3] [MODEL ...]

MODEL: a preset name or a config.json (default: every preset). `--cache-dir DIR` warms and
reads the artifact cache of DIR (e.g. a tuned host's cache dir, thousands of artifacts)
instead of an empty one. `--host-only` runs where there is no GPU: every process fakes an
H200 (testkit/fake_gpu.py) before its warmup's clock starts (loading an artifact needs no GPU,
and nothing is launched), and CUDA's time is not measured.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from testkit.fake_gpu import fake_h200

START = """
import time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import cutetune
t2 = time.perf_counter()
import json, os, sys
{fake}
profile = None
if os.environ.get("CUTETUNE_WARMUP_PROFILE") == "1":
    import cProfile
    profile = cProfile.Profile()
    profile.enable()
t3 = time.perf_counter()
dispatcher = cutetune.warmup(sys.argv[1])
t4 = time.perf_counter()
if profile:
    import pstats
    profile.disable()
    pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
t5 = time.perf_counter()
cutetune.rmsnorm
t6 = time.perf_counter()
tops = [name.split(".")[0] for name in sys.modules]
stats = dispatcher.stats.values()
print(json.dumps({{
    "torch_import_s": t1 - t0, "cutetune_import_s": t2 - t1, "warmup_s": t4 - t3,
    "first_op_s": t6 - t5, "points": sum(s.points for s in stats),
    "loaded": sum(s.loaded for s in stats),
    "cutedsl_modules": tops.count("cutlass"), "optuna_modules": tops.count("optuna"),
    "sqlalchemy_modules": tops.count("sqlalchemy"), "report": dispatcher.report()}}))
"""

# What DeviceFingerprint.current asks of CUDA, alone, after `import torch`.
CUDA_INIT = """
import time
import torch
start = time.perf_counter()
torch.cuda.get_device_properties(torch.cuda.current_device())
print(time.perf_counter() - start)
"""


def store_winners(model: str, db_url: str, host_only: bool) -> int:
    """A winner at every bucket of every problem the model's kernels have; the number stored."""
    from cutetune.device.funnel import make_plan
    from cutetune.device.specs import Ceilings, device_spec_for
    from cutetune.kernels.registry import NotApplicableError, get_kernel, kernel_names
    from cutetune.results_db import (
        Database,
        DeviceFingerprint,
        TrialRecord,
        TuningResult,
        record_tuning_result,
    )
    from cutetune.spaces.buckets import DEFAULT_TUNE_TOKENS
    from cutetune.spaces.models import load_model
    from cutetune.spaces.space import config_to_json

    if host_only:
        fake_h200()
    fingerprint = DeviceFingerprint.current()
    spec = device_spec_for(fingerprint.gpu_name)
    ceilings = Ceilings.from_datasheet(spec)
    db = Database.open(db_url)
    now = datetime.now(UTC)
    stored = 0
    for name in kernel_names():
        kernel = get_kernel(name)
        try:
            problems = kernel.problems_for_model(load_model(model), "bfloat16")
        except NotApplicableError:
            continue
        for static in problems:
            for turn, bucket in enumerate(DEFAULT_TUNE_TOKENS):
                problem = static.with_tokens(bucket)
                kept = make_plan(kernel, problem, spec, ceilings).kept
                config = kept[turn % len(kept)].config
                trial = TrialRecord(0, config_to_json(config), "ok", None, 1.0, 0.01, 10, None,
                                    None, None)
                record_tuning_result(db, fingerprint, TuningResult(
                    name, kernel.source_hash(), static.static_key(), bucket, bucket,
                    f"warmup-time {name} {bucket}", now, now, (trial,), 0))
                stored += 1
    db.dispose()
    return stored


def start(model: str, env: dict[str, str], host_only: bool, timeout_s: float) -> dict:
    """One start in a fresh process; its stderr (the dispatcher's log) is shown when it fails
    or runs past `timeout_s`."""
    # The child runs where this process does (the repository root), which `-c` puts on its
    # path, so it imports testkit as this process does.
    code = START.format(fake="from testkit.fake_gpu import fake_h200; fake_h200()"
                        if host_only else "")
    try:
        done = subprocess.run([sys.executable, "-c", code, model], env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as expired:
        raise SystemExit(f"{model}: a start still running after {timeout_s:.0f} s; its "
                         f"stderr:\n{expired.stderr or ''}") from None
    if done.returncode:
        raise SystemExit(f"{model}: a start failed ({done.returncode}):\n{done.stderr}")
    if os.environ.get("CUTETUNE_WARMUP_PROFILE") == "1":
        print(done.stderr, file=sys.stderr, flush=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def cuda_init_seconds() -> float:
    done = subprocess.run([sys.executable, "-c", CUDA_INIT], capture_output=True, text=True,
                          check=True, timeout=120)
    return float(done.stdout.split()[-1])


def print_report(heading: str, run: dict) -> None:
    """A start's times and its report up to the per-problem lines, as soon as it has run (a
    later start that runs out of time leaves this one's on record)."""
    print(heading, flush=True)
    print("\n".join(line for line in run["report"].splitlines()
                    if line.startswith(("warmup of", "artifact cache"))), flush=True)


def model_row(model: str, starts: int, cache_dir: Path | None, host_only: bool,
              cuda_init_s: float | None, timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        db_url = f"sqlite:///{scratch}/winners.db"
        winners = store_winners(model, db_url, host_only)
        cache = cache_dir or Path(scratch) / "cache"
        env = {**os.environ, "CUTETUNE_CACHE_DIR": str(cache), "CUTETUNE_DB": db_url}
        print(f"{model}: {winners} winners stored; warming the cache", file=sys.stderr,
              flush=True)
        warming = {name: value for name, value in env.items()
                   if name != "PYTHONDONTWRITEBYTECODE"}
        cold = start(model, warming, host_only, timeout_s)
        print_report(f"{model}: cold {cold['warmup_s']:.2f} s", cold)
        warm = []
        for number in range(starts):
            warm.append(start(model, env, host_only, timeout_s))
            print_report(f"{model}: warm start {number + 1}: import torch "
                         f"{warm[-1]['torch_import_s']:.2f} s, import cutetune "
                         f"{warm[-1]['cutetune_import_s']:.3f} s, warmup "
                         f"{warm[-1]['warmup_s']:.3f} s", warm[-1])
        artifacts = len(list((cache / "artifacts").glob("*-*.so")))

    def median(name: str) -> float:
        return statistics.median(run[name] for run in warm)

    last = warm[-1]
    return {"model": model, "winners": winners, "points": last["points"],
            "loaded": last["loaded"], "cache_artifacts": artifacts,
            "cold_s": round(cold["warmup_s"], 2),
            "torch_import_s": round(median("torch_import_s"), 3),
            "cutetune_import_s": round(median("cutetune_import_s"), 4),
            "warmup_s": round(median("warmup_s"), 3),
            "warmup_max_s": round(max(run["warmup_s"] for run in warm), 3),
            "first_op_s": round(median("first_op_s"), 3),
            "cuda_init_s": "" if cuda_init_s is None else round(cuda_init_s, 3),
            "cutedsl_modules": max(run["cutedsl_modules"] for run in warm),
            "optuna_modules": max(run["optuna_modules"] for run in warm),
            "sqlalchemy_modules": max(run["sqlalchemy_modules"] for run in warm),
            "starts": starts, "cpus": os.cpu_count(), "host_only": host_only}


def main() -> None:
    from cutetune.spaces.models import PRESETS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="presets or config.json paths "
                        "(default: every preset)")
    parser.add_argument("--out", required=True, help="the CSV to write (after each model)")
    parser.add_argument("--starts", type=int, default=3, help="warm starts per model")
    parser.add_argument("--cache-dir", type=Path, help="the cache dir whose artifact cache "
                        "is warmed and read (default: an empty one per model)")
    parser.add_argument("--host-only", action="store_true",
                        help="no GPU here: fake an H200 (CUDA's time is not measured)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds one start may take")
    args = parser.parse_args()
    if args.starts < 1:
        parser.error("--starts must be at least 1")
    cuda_init_s = None if args.host_only else cuda_init_seconds()
    if cuda_init_s is not None:
        print(f"CUDA's initialisation alone: {cuda_init_s:.3f} s", flush=True)
    rows = []
    for model in args.models or sorted(PRESETS):
        rows.append(model_row(model, args.starts, args.cache_dir, args.host_only, cuda_init_s,
                              args.timeout))
        print(rows[-1], flush=True)
        # Written after each model, so a run stopped for time keeps what it measured.
        with open(args.out, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()

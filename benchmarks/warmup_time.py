"""How long `cutetune.warmup(model)` takes on this GPU, cold (empty artifact cache) and warm.

Each model gets a results DB holding a winner for every bucket (1..32768) of every problem of
every kernel it uses, each bucket a different point where the space has enough (the roofline's
ranked points, in turn), so that the warmup makes ready as many distinct points as a fully
tuned model could. Each warmup runs in a fresh process with torch already imported and CUDA
initialised; the time is that of the `warmup` call alone. Each warmup's report lines (time per
kernel, and the artifact cache's loaded / compiled counts with the seconds each took) are
printed; with CUTETUNE_WARMUP_PROFILE=1 each child also prints the 30 costliest calls of its
warmup (cProfile, cumulative) to stderr, shown here. The children write the bytecode of what
they import, as an installed package has it (pip compiles it at install) where the environment
says not to (PYTHONDONTWRITEBYTECODE): otherwise a warm warmup would compile its imports' source,
a second on the H200 host, which no installed cutetune pays. The CSV records the CuTeDSL modules
a warm warmup imports (none: its artifacts load without CuTeDSL).

    python3 -m benchmarks.warmup_time OUT.csv MODEL [MODEL ...]
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

CHILD = """
import sys
sys.dont_write_bytecode = False
import cProfile, json, os, pstats, time
import torch
torch.cuda.init()
import cutetune
profile = cProfile.Profile() if os.environ.get("CUTETUNE_WARMUP_PROFILE") == "1" else None
start = time.perf_counter()
if profile:
    profile.enable()
dispatcher = cutetune.warmup(sys.argv[1], db_url=sys.argv[2])
torch.cuda.synchronize()
seconds = time.perf_counter() - start
if profile:
    profile.disable()
    pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
stats = dispatcher.stats.values()
cutedsl = sum(name.startswith("cutlass") for name in sys.modules)
print(json.dumps({"seconds": seconds, "points": sum(s.points for s in stats),
                  "loaded": sum(s.loaded for s in stats), "cutedsl_modules": cutedsl,
                  "report": dispatcher.report()}))
"""


def store_winners(model: str, db_url: str) -> int:
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


def timed_warmup(model: str, db_url: str, cache_dir: Path, timeout_s: float) -> dict:
    """One warmup in a fresh process; its stderr (the dispatcher's log) is shown when it fails
    or runs past `timeout_s`."""
    env = {**os.environ, "CUTETUNE_CACHE_DIR": str(cache_dir)}
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, model, db_url], env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as expired:
        raise SystemExit(f"{model}: warmup still running after {timeout_s:.0f} s; its stderr:\n"
                         f"{expired.stderr or ''}") from None
    if done.returncode:
        raise SystemExit(f"{model}: warmup failed ({done.returncode}):\n{done.stderr}")
    if os.environ.get("CUTETUNE_WARMUP_PROFILE") == "1":
        print(done.stderr, file=sys.stderr, flush=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_report(heading: str, run: dict) -> None:
    """A warmup's time and its report up to the per-problem lines, as soon as it has run (a
    later warmup that runs out of time leaves this one's on record)."""
    print(heading, flush=True)
    print("\n".join(line for line in run["report"].splitlines()
                    if line.startswith(("warmup of", "artifact cache"))), flush=True)


def main(out: str, models: list[str], timeout_s: float = 300.0) -> None:
    rows = []
    for model in models:
        with tempfile.TemporaryDirectory() as scratch:
            db_url = f"sqlite:///{scratch}/winners.db"
            winners = store_winners(model, db_url)
            print(f"{model}: {winners} winners stored; cold warmup", file=sys.stderr, flush=True)
            cold = timed_warmup(model, db_url, Path(scratch) / "cache", timeout_s)
            print_report(f"{model}: cold {cold['seconds']:.2f} s", cold)
            warm = timed_warmup(model, db_url, Path(scratch) / "cache", timeout_s)
            print_report(f"{model}: warm {warm['seconds']:.3f} s", warm)
        rows.append({"model": model, "winners": winners, "points": cold["points"],
                     "cold_s": round(cold["seconds"], 2), "warm_s": round(warm["seconds"], 3),
                     "warm_loaded": warm["loaded"], "warm_cutedsl_modules": warm["cutedsl_modules"],
                     "cpus": os.cpu_count()})
        print(rows[-1], flush=True)
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

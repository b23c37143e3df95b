"""Exhaustive measurements for replayed searches (issue 42 item 2): every valid point of every
problem the models use, at each bucket, timed on the GPU as the tuner times a trial (compile,
verify against the reference, CUDA-graph replay; GpuTrialRunner), one CSV row each.

    python3 -m benchmarks.exhaustive --out OUT/exhaustive.csv [--models presets|held-out|M,M]
        [--kernels K,K] [--tokens 1,8,64,512,4096,32768] [--budget-s 420] [--state DIR]

Each point is verified against the reference alone, then a bucket's verified points (32 at a
time) are timed side by side in interleaved rounds, as the tuner re-measures its finalists (on
one draw of inputs, where the finals pool three), so they compare at one moment of the GPU.
Resumable, and sized for one device call: points already in OUT are skipped, the rest are
measured in order (models, kernels, problems, buckets, points) until --budget-s has passed, and
rows are appended as they are measured; the same command continues where the last stopped. The
points a call that died was timing are measured one at a time by the next, and the one that
takes its process down (a sticky CUDA error) is written as failed by the call after. Compiles
run ahead of the GPU in CPU processes (one per core, less one) into an artifact cache under
--state; a problem shared by several models is measured once (the first model names it). About
37,000 points for the ten presets at six buckets, of 6,300 distinct compiles (a point compiles
once for every bucket).

`python3 -m benchmarks.replay_tables` computes the replay, pruning and zero-shot tables from the
CSV: the presets fit the calibration and are replayed, the held-out models (HELD_OUT: real
models whose shapes no preset has) are the zero-shot test.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from cutetune.kernels.registry import KernelDef, NotApplicableError, get_kernel, kernel_names
from cutetune.spaces.models import PRESET_NAMES, load_model
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import config_to_json

TOKENS = (1, 8, 64, 512, 4096, 32768)
# Real models whose shapes no preset has: other hidden sizes (3584, 5376, 6144, 2880), head
# counts (28/4, 32/16, 48/8, 64/8 of head dim 64, 96/8) and expert counts (8 of 16384, 32,
# 128 of 1408, 384).
HELD_OUT = tuple(f"tests/data/hf_configs/{name}.json" for name in (
    "Qwen2.5-7B-Instruct", "gemma-3-27b-it", "Mixtral-8x22B-v0.1", "gpt-oss-20b",
    "GLM-4.5-Air", "Kimi-K2-Instruct"))
PROCESS_LOST = "took its process down when measured"
COLUMNS = ("model", "kernel_name", "static_key", "bucket", "config_json", "status",
           "median_us", "iqr_us", "failure_reason")


def models_of(choice: str) -> tuple[str, ...]:
    if choice == "presets":
        return PRESET_NAMES
    if choice == "held-out":
        return HELD_OUT
    return tuple(m for m in choice.split(",") if m)


def work(models: Sequence[str], kernels: Sequence[str], tokens: Sequence[int], spec
         ) -> Iterator[tuple[str, KernelDef, Problem, object]]:
    """(model, kernel, problem at its bucket, config) of every valid point, each problem
    once."""
    seen: set[tuple[str, str]] = set()
    for model in models:
        shape = load_model(model)
        for name in kernels:
            kernel = get_kernel(name)
            try:
                problems = kernel.problems_for_model(shape, "bfloat16")
            except NotApplicableError:
                continue
            for static in problems:
                if (name, static.static_key()) in seen:
                    continue
                seen.add((name, static.static_key()))
                for bucket in tokens:
                    problem = static.with_tokens(bucket)
                    for config in kernel.space.enumerate(problem, spec).valid:
                        yield model, kernel, problem, config


def row_key(kernel: str, static_key: str, bucket: int | str, config_json: str) -> tuple:
    return kernel, static_key, int(bucket), config_json


def done_keys(out: Path) -> set[tuple]:
    if not out.is_file():
        return set()
    with out.open() as f:
        return {row_key(r["kernel_name"], r["static_key"], r["bucket"], r["config_json"])
                for r in csv.DictReader(f)}


def measure(args: argparse.Namespace) -> None:
    import torch

    from cutetune.build.artifacts import ARTIFACTS_DIR, ArtifactStore, arch_for
    from cutetune.build.compile_pool import CompilePool
    from cutetune.device.specs import device_spec_for
    from cutetune.results_db import DeviceFingerprint
    from cutetune.tuner.study import TrialFailure
    from cutetune.tuner.trials import GpuTrialRunner

    start = time.monotonic()
    fingerprint = DeviceFingerprint.current()
    spec = device_spec_for(fingerprint.gpu_name)
    args.state.mkdir(parents=True, exist_ok=True)
    in_flight = args.state / "in_flight.txt"
    # What a call that died was doing: one point (verifying, or timing alone) took the
    # process down and is failed; several (timed side by side) are timed alone now, so that
    # the one that does is known.
    lost = in_flight.read_text().splitlines() if in_flight.is_file() else []
    culprit = lost[0] if len(lost) == 1 else None
    suspects = set(lost) if len(lost) > 1 else set()
    done = done_keys(args.out)
    new_file = not args.out.is_file()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = args.out.open("a", newline="")
    writer = csv.DictWriter(out, COLUMNS)
    if new_file:
        writer.writeheader()

    def write(model, kernel, problem, config, status, median=None, iqr=None, reason=None):
        writer.writerow({"model": model, "kernel_name": kernel.name,
                         "static_key": problem.static_key(), "bucket": problem.num_tokens,
                         "config_json": config_to_json(config), "status": status,
                         "median_us": median, "iqr_us": iqr, "failure_reason": reason})
        out.flush()

    pending = [(m, k, p, c) for m, k, p, c in work(models_of(args.models), args.kernels,
                                                    args.tokens, spec)
               if row_key(k.name, p.static_key(), p.num_tokens, config_to_json(c)) not in done]
    print(f"{len(done)} points stored, {len(pending)} left", flush=True)
    store = ArtifactStore(args.state / "cache" / ARTIFACTS_DIR,
                          arch_for(fingerprint.compute_capability))
    modules = sorted({k.compile_function.__module__ for _, k, _, _ in pending})
    pool = CompilePool(store, max(1, (os.cpu_count() or 2) - 1), modules) if pending else None
    futures = {}
    measured = 0
    chunks = _chunks(pending)
    for index, chunk in enumerate(chunks):
        if time.monotonic() - start > args.budget_s:
            break
        for _, kernel, problem, config in (p for c in chunks[index:index + 4] for p in c):
            key = (kernel.name, problem.static_key(), config_to_json(config))
            if key not in futures:  # compiled ahead: the next chunks' points
                futures[key] = pool.submit(kernel, problem, config, ahead=True)
        _, kernel, problem, _ = chunk[0]
        torch.cuda.empty_cache()  # the last chunk's input sets and graphs given back
        runner = GpuTrialRunner(kernel, problem, spec, compile_point=store.get)
        verified = []
        for item in chunk:
            config = item[3]
            compiled = futures[(kernel.name, problem.static_key(), config_to_json(config))]
            if compiled.result().failure is not None:
                write(*item, "failed", reason=compiled.result().failure)
                continue
            line = _in_flight_line(kernel, problem, config)
            if line == culprit:
                write(*item, "failed", reason=PROCESS_LOST)
                continue
            if line in suspects:
                in_flight.write_text(line)
                try:
                    m = runner.measure(config)
                    write(*item, "ok", m.median_us, m.iqr_us)
                except TrialFailure as failure:
                    write(*item, "failed", reason=str(failure))
                in_flight.write_text("")
                continue
            in_flight.write_text(line)
            try:
                runner.verified(config)
                verified.append(item)
            except TrialFailure as failure:
                write(*item, "failed", reason=str(failure))
        # Side by side, as the tuner's finalists are: the points of a bucket compare at one
        # moment of the GPU, with no drift between them.
        in_flight.write_text("\n".join(_in_flight_line(kernel, problem, i[3])
                                       for i in verified))
        if verified:
            for item, m in zip(verified, runner.remeasure([i[3] for i in verified],
                                                          draws=EXHAUSTIVE_DRAWS), strict=True):
                write(*item, "ok", m.median_us, m.iqr_us)
        in_flight.write_text("")
        measured += len(chunk)
        del runner
    in_flight.unlink(missing_ok=True)
    out.close()
    left = len(pending) - measured
    print(f"measured {measured} points in {time.monotonic() - start:.0f} s; "
          f"{left} left{' (run the same command again)' if left else ''}", flush=True)
    if pool is not None:
        pool.close()  # after the few points compiled ahead, which the next call finds stored


def _in_flight_line(kernel: KernelDef, problem: Problem, config) -> str:
    return "\t".join((kernel.name, problem.static_key(), str(problem.num_tokens),
                      config_to_json(config)))


# At most this many points of a bucket are timed side by side (their graphs held at once).
CHUNK = 32
# One draw of input sets, where the tuner's finals pool three (tuner/finals.py): a replayed
# search compares points of one bucket measured at one moment, and the draws would triple the
# GPU time of 37,000 points, each a few graph captures and about 30 replays of a 2 ms graph.
EXHAUSTIVE_DRAWS = 1


def _chunks(pending: Sequence[tuple]) -> list[list[tuple]]:
    """`pending` cut into runs of one bucket's points, CHUNK at most."""
    chunks: list[list[tuple]] = []
    for item in pending:
        _, kernel, problem, _ = item
        last = chunks[-1][0] if chunks else None
        if (last is None or len(chunks[-1]) >= CHUNK
                or (last[1].name, last[2]) != (kernel.name, problem)):
            chunks.append([])
        chunks[-1].append(item)
    return chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="presets",
                        help="presets, held-out, or comma-separated presets / config paths")
    parser.add_argument("--kernels", type=lambda s: [k for k in s.split(",") if k],
                        default=None, help="comma-separated kernels [default: all]")
    parser.add_argument("--tokens", type=lambda s: [int(t) for t in s.split(",")],
                        default=list(TOKENS))
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start no new point after this many seconds")
    parser.add_argument("--state", type=Path, default=Path("exhaustive-state"),
                        help="the artifact cache and the point in flight")
    args = parser.parse_args()
    args.kernels = args.kernels or kernel_names()
    measure(args)


if __name__ == "__main__":
    main()

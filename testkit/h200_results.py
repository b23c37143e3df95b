"""The committed H200 results database (tests/data/README.md) and copies of it made into test
inputs: re-keyed to the current kernel sources, with synthetic bench rows and failed trials."""

from __future__ import annotations

import shutil
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from cutetune.kernels.registry import get_kernel
from cutetune.report.data import model_problems
from cutetune.results_db import (
    BenchRecord,
    Database,
    TrialRecord,
    TuningResult,
    record_bench,
    record_tuning_result,
    winners_with_devices,
)

H200_RESULTS = Path(__file__).resolve().parents[1] / "tests" / "data" / "h200_results.db"
H200_URL = f"sqlite:///{H200_RESULTS}"
# Synthetic bench times per call at one token (they grow with the token count): test input for
# the bench sections' code, not measurements.
BENCH_US = {"cutetune tuned": 1.0, "cutetune default": 1.3, "liger": 1.2, "quack": 1.5,
            "copy, same bytes": 0.9}
BENCH_TOKENS = (1, 64, 4096)
FAILURES = ("hang", "crash: SIGSEGV", "crash: SIGABRT")
# Kernels added since the H200 results and the shipped winners were tuned, with where their
# H200 tune stands: the models use them, but neither holds their winners yet (warmup serves
# their heuristic default). Once tuned on the H200, a kernel leaves this list.
AWAITING_H200_TUNE = {
    "embedding": "issue 39 item 4: written without a GPU, tuned next session",
    "embedding_rmsnorm": "issue 39 item 4: written without a GPU, tuned next session",
    "rope": "issue 39 item 1: written without a GPU, tuned next session",
    "qk_norm_rope": "issue 39 item 2: written without a GPU, tuned next session",
    "qk_norm_rope_kv": "issue 39 item 3: written without a GPU, tuned next session",
    "fp8_group_quant": "issue 40 item 1: written without a GPU, tuned next session",
    "silu_and_mul_fp8_quant": "issue 40 item 2: written without a GPU, tuned next session",
    "rmsnorm_fp8_quant": "issue 40 item 2: written without a GPU, tuned next session",
    "mxfp8_quant": "issue 40 item 3: written without a GPU, tuned next session",
    "nvfp4_quant": "issue 40 item 3: written without a GPU, tuned next session",
    "moe_dispatch_fp8_quant": "issue 40 item 2: written without a GPU, tuned next session",
}


def current_copy(tmp_path: Path) -> str:
    """A writable copy whose winners carry the current kernel sources' hashes (the same code
    tuned on the H200, hashed by this Python), so the dispatcher serves them."""
    path = tmp_path / "h200_current.db"
    shutil.copy(H200_RESULTS, path)
    path.chmod(0o644)
    with sqlite3.connect(path) as connection:
        names = [name for (name,) in connection.execute("SELECT name FROM kernels")]
        for name in names:
            connection.execute("UPDATE kernels SET source_hash = ? WHERE name = ?",
                               (get_kernel(name).source_hash(), name))
    connection.close()
    return f"sqlite:///{path}"


def add_bench_and_failures(url: str, model: str = "qwen3-8b") -> None:
    """Synthetic bench rows for every problem of `model`, and one tuning run of its first
    problem whose trials all failed, one per reason of FAILURES."""
    db = Database.open(url)
    device = winners_with_devices(db)[0][0]
    problems = model_problems(model)
    record_bench(db, device, [
        BenchRecord(p.kernel.name, p.problem.static_key(), tokens, name,
                    us * (1 + tokens / 64), 1000 / (us * (1 + tokens / 64)),
                    90 / (us * (1 + tokens / 64)))
        for p in problems for tokens in BENCH_TOKENS for name, us in BENCH_US.items()])
    first = problems[0]
    now = datetime.now(UTC)
    record_tuning_result(db, device, TuningResult(
        kernel_name=first.kernel.name, source_hash=first.kernel.source_hash(),
        static_key=first.problem.static_key(), bucket=2, num_tokens=2,
        study_name="synthetic failures", started_at=now, finished_at=now,
        trials=tuple(TrialRecord(number, f'{{"point": {number}}}', "failed", reason,
                                 None, None, None, None, None, None)
                     for number, reason in enumerate(FAILURES)),
        winner_number=None))
    db.dispose()

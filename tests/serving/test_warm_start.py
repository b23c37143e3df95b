"""A warm start as an engine pays it (issue 38 item 5): in a fresh process, `import torch,
cutetune`, then `cutetune.warmup(model)` with every point it serves in the artifact cache, loads
them all and imports neither CuTeDSL (the compiler), nor Optuna (the search), nor SQLAlchemy
(the user's SQLite database is read with sqlite3), nor transformers: each is a part of a second
an engine's start would pay. The GPU is faked as an H200 (testkit/fake_gpu.py): loading an
artifact needs none, and nothing is launched. benchmarks/warmup_time.py times such starts."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata

import torch

from cutetune.build.artifacts import ARTIFACTS_DIR, ArtifactStore
from cutetune.device.specs import device_spec_for
from cutetune.kernels.activation import ActivationConfig
from cutetune.kernels.registry import get_kernel
from cutetune.kernels.stored import stored_point
from cutetune.results_db import (
    Database,
    DeviceFingerprint,
    TrialRecord,
    TuningResult,
    record_tuning_result,
    shipped_winners,
    winners_to_serve_at,
)
from cutetune.serving.plan import ServingPlan
from cutetune.serving.precompile import precompile
from cutetune.spaces.models import load_model
from cutetune.spaces.space import config_to_json
from testkit.child_process import child_env

# What testkit.fake_gpu makes the child's fingerprint.
FAKE_H200 = DeviceFingerprint("NVIDIA H200", "9.0", 132, "13.0", str(torch.version.cuda),
                              torch.__version__, metadata.version("nvidia-cutlass-dsl"))
TUNED_AT_8 = ActivationConfig(vector_bits=128, vectors_per_thread=2, warps_per_block=4,
                              cache_hints="normal")
NOT_ON_A_WARM_START = {"cutlass", "optuna", "sqlalchemy", "transformers"}

START = f"""
import json, sys
import torch, cutetune
from testkit.fake_gpu import fake_h200
fake_h200()
dispatcher = cutetune.warmup("qwen3-0.6b", kernels=["silu_and_mul"])
(table,) = dispatcher.tables()
(stats,) = dispatcher.stats.values()
print(json.dumps({{
    "points": stats.points, "loaded": stats.loaded, "summary": dispatcher.cache_summary(),
    "report": dispatcher.report(),
    "tuned": [entry.bucket for entry in table.entries if entry.source == "tuned"],
    "modules": sorted({{name.split(".")[0] for name in sys.modules}} & {NOT_ON_A_WARM_START!r})}}))
"""


def test_a_warm_start_loads_every_point_and_imports_no_compiler_search_or_sqlalchemy(tmp_path):
    kernel = get_kernel("silu_and_mul")
    (static,) = kernel.problems_for_model(load_model("qwen3-0.6b"), "bfloat16")
    spec = device_spec_for(FAKE_H200.gpu_name)
    stored_point(kernel, static.static_key(), 8, config_to_json(TUNED_AT_8), spec)  # usable
    db_url = f"sqlite:///{tmp_path / 'results.db'}"
    db = Database.open(db_url)
    now = datetime.now(UTC)
    trial = TrialRecord(0, config_to_json(TUNED_AT_8), "ok", None, 1.0, 0.01, 10, None, None,
                        None)
    record_tuning_result(db, FAKE_H200, TuningResult(
        kernel.name, kernel.source_hash(), static.static_key(), 8, 8, "tuned at 8", now, now,
        (trial,), 0))
    db.dispose()
    # The cache warmed as `cutetune cache build` warms it: every point the warmup will serve.
    plan = ServingPlan(spec, winners_to_serve_at(db_url, FAKE_H200), shipped_winners(FAKE_H200))
    store = ArtifactStore(tmp_path / "cache" / ARTIFACTS_DIR, "sm_90a")
    points, _ = precompile(plan, store, [(kernel, [static])], processes=1)

    done = subprocess.run([sys.executable, "-c", START], capture_output=True, text=True,
                          env=child_env(CUTETUNE_CACHE_DIR=str(tmp_path / "cache"),
                                        CUTETUNE_DB=db_url), timeout=300)
    assert done.returncode == 0, done.stderr
    started = json.loads(done.stdout.splitlines()[-1])
    assert started["points"] == started["loaded"] == points >= 1, started["summary"]
    assert f"{points} loaded" in started["summary"] and " 0 compiled " in started["summary"]
    assert started["tuned"] == [8], done.stderr + started["report"]
    assert started["modules"] == []

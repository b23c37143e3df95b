"""One tune, stored in the DB, warmed up and served through cutetune.qk_norm."""

from __future__ import annotations

import pytest
import torch

import cutetune
from cutetune.device.specs import Ceilings, device_spec_for
from cutetune.device.verify import check_outputs
from cutetune.kernels import qk_norm as qk
from cutetune.results_db import Database, DeviceFingerprint, winners
from cutetune.serving.plan import NEAREST, TUNED
from cutetune.serving.table import Dispatcher
from cutetune.serving.warmup import set_current
from cutetune.spaces.models import load_model
from cutetune.tuner.trials import GpuTrialRunner
from cutetune.tuner.tune import plan_bucket, tune_bucket

pytestmark = pytest.mark.gpu


def test_tune_store_warmup_serve(tmp_path):
    url = f"sqlite:///{tmp_path / 'e2e.db'}"
    db = Database.open(url)
    fingerprint = DeviceFingerprint.current()
    spec = device_spec_for(fingerprint.gpu_name)
    static = qk.problems_for_model(load_model("qwen3-0.6b"), "bfloat16")[0]
    planned = plan_bucket(qk.KERNEL, static, 8, spec, Ceilings.from_datasheet(spec))
    result = tune_bucket(planned, GpuTrialRunner(qk.KERNEL, planned.problem, spec), db,
                         fingerprint, budget=4)
    assert result.winner is not None and len(result.trials) == 4
    stored = winners(db, fingerprint, "qk_norm")
    assert [(w.bucket, w.static_key) for w in stored] == [(8, static.static_key())]

    served = cutetune.warmup("qwen3-0.6b", kernels=["qk_norm"], db_url=url)
    try:
        table = served.tables()[0]
        assert table.entries[3].source == TUNED and table.entries[3].bucket == 8
        assert table.entries[4].source == NEAREST
        g = torch.Generator("cuda").manual_seed(3)
        tensors = qk.make_inputs(static.with_tokens(7), torch.device("cuda"), g)
        expected = qk.reference(tensors, static)
        cutetune.qk_norm(tensors["q"], tensors["k"], tensors["q_weight"], tensors["k_weight"],
                         eps=static.eps)
        torch.cuda.synchronize()
        check_outputs(qk.KERNEL, static, tensors, expected)
        assert served.default_calls() == {}
        assert "tuned buckets 8" in served.report()
    finally:
        set_current(None)


def test_unwarmed_problem_falls_back_and_is_counted(caplog):
    served = Dispatcher(device_spec_for(torch.cuda.get_device_name()))
    set_current(served)
    try:
        q = torch.randn(3, 2, 64, device="cuda", dtype=torch.float16)
        k = torch.randn(3, 1, 64, device="cuda", dtype=torch.float16)
        w = torch.ones(64, device="cuda", dtype=torch.float16)
        with caplog.at_level("WARNING", logger="cutetune.serving"):
            cutetune.qk_norm(q, k, w, w)
            cutetune.qk_norm(q, k, w, w)
        assert sum("not warmed up" in r.message for r in caplog.records) == 1
        assert list(served.default_calls().values()) == [2]
        assert "NOT warmed up" in served.report()
    finally:
        set_current(None)

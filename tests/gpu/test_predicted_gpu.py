"""A calibrated device serves a model nobody tuned the calibrated model's picks (issue 42 item
4): warmup names them `predicted`, remembers them beside the artifact cache, and the public op
computes correctly through them."""

from __future__ import annotations

import pytest
import torch

import cutetune
from cutetune.results_db import Database, DeviceFingerprint
from cutetune.serving.plan import PREDICTED
from cutetune.serving.predicted import PICKS_FILE
from cutetune.serving.warmup import set_current
from cutetune.tuner.calibrate import calibrate
from testkit.known_cost_model import store_known_trials

pytestmark = pytest.mark.gpu


def test_an_untuned_model_is_served_the_calibrated_picks(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTETUNE_CACHE_DIR", str(tmp_path / "cache"))
    url = f"sqlite:///{tmp_path / 'calibrated.db'}"
    db = Database.open(url)
    store_known_trials(db, DeviceFingerprint.current(), (1, 64, 4096, 32768))
    (done,) = calibrate(db)
    db.dispose()
    assert done.model is not None, done.refused
    # qwen3-0.6b: no winner stored for its norms, and none shipped to lend one (borrowing:
    # tests/serving/test_borrowed.py).
    monkeypatch.setattr("cutetune.results_db.shipped_winners", lambda fingerprint: [])
    served = cutetune.warmup("qwen3-0.6b", kernels=["rmsnorm"], db_url=url)
    try:
        for table in served.tables():
            assert {e.source for e in table.entries} == {PREDICTED}
        assert "predicted 1.." in served.report()
        assert list((tmp_path / "cache").rglob(PICKS_FILE))
        x = torch.randn(7, 1024, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
        expected = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
                    * w.float())
        out = cutetune.rmsnorm(x, w, eps=1e-6)
        torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
        assert served.default_calls() == {}
    finally:
        set_current(None)

"""benchmarks/fast_path_host.py times what it says: each op's fast path, served the C++
function that does nothing."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fast_path_host  # noqa: E402

from cutetune import dispatch  # noqa: E402
from cutetune.dispatch import Dispatcher  # noqa: E402


@pytest.fixture(autouse=True)
def restored(monkeypatch):
    """What the script patches, put back after the test."""
    for owner, name in ((Dispatcher, "_install"), (torch.Tensor, "get_device")):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    yield
    dispatch.set_current(None)


def test_every_op_is_timed_on_its_fast_path(monkeypatch, capsys):
    monkeypatch.setattr(fast_path_host, "CALLS", 20)
    monkeypatch.setattr(fast_path_host, "ROUNDS", 1)
    fast_path_host.main()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == [
        "qk_norm", "rmsnorm", "fused_add_rmsnorm", "silu_and_mul", "moe_combine", "t.shape"]


def test_an_op_off_its_fast_path_is_refused(monkeypatch):
    # A call with no tokens: the checked path every time.
    x, weight = torch.zeros(0, 2048, dtype=torch.bfloat16), torch.zeros(2048)
    call = (lambda: fast_path_host.cutetune.rmsnorm(x, weight.bfloat16()), ())
    monkeypatch.setattr(fast_path_host, "op_calls", lambda: {"rmsnorm": call})
    with pytest.raises(SystemExit, match="rmsnorm does not take the fast path this script"):
        fast_path_host.main()

"""benchmarks/fast_path_host.py times what it says: each op's fast path, served the C++
function that does nothing."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fast_path_host  # noqa: E402

import cutetune  # noqa: E402
from cutetune.kernels.registry import NotApplicableError  # noqa: E402
from cutetune.ops.registry import ops  # noqa: E402
from cutetune.serving.table import Dispatcher  # noqa: E402
from cutetune.serving.warmup import set_current  # noqa: E402
from cutetune.spaces.models import load_model  # noqa: E402


@pytest.fixture(autouse=True)
def restored(monkeypatch):
    """What the script patches, put back after the test."""
    for owner, name in ((Dispatcher, "_install"), (torch.Tensor, "get_device")):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    yield
    set_current(None)


def test_every_op_is_timed_on_its_fast_path(monkeypatch, capsys):
    monkeypatch.setattr(fast_path_host, "CALLS", 20)
    monkeypatch.setattr(fast_path_host, "ROUNDS", 1)
    fast_path_host.main()
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line[:26].strip() for line in lines] == [*fast_path_host.op_calls(), "t.shape"]
    assert all(line.endswith(" us") for line in lines)


def test_the_ops_timed_are_every_op_of_the_model_but_those_that_need_a_gpu():
    """An op that prepares every call for its route (moe_dispatch: a CUDA workspace) is left
    out; every other op whose kernel the model uses is timed."""
    timed = fast_path_host.op_calls()
    shape = load_model(fast_path_host.MODEL)
    for op in ops():
        try:
            op.kernel.problems_for_model(shape, "bfloat16")
        except NotApplicableError:
            continue
        needs_a_gpu = op.prepare is not None and op.output is None
        assert any(f.__name__ in timed for f in op.functions) is not needs_a_gpu, op.name


def test_an_op_off_its_fast_path_is_refused(monkeypatch):
    # A call with no tokens: the checked path every time.
    x, weight = torch.zeros(0, 2048, dtype=torch.bfloat16), torch.zeros(2048)
    call = (lambda: cutetune.rmsnorm(x, weight.bfloat16()), ())
    monkeypatch.setattr(fast_path_host, "op_calls", lambda: {"rmsnorm": call})
    with pytest.raises(SystemExit, match="rmsnorm does not take the fast path this script"):
        fast_path_host.main()

"""benchmarks/fast_path_host.py times what it says: each op's fast path, served the C++
function that does nothing."""

import pytest
import torch

import cutetune
from benchmarks import fast_path_host
from cutetune.kernels.registry import NotApplicableError
from cutetune.ops.registry import ops
from cutetune.serving.warmup import current_dispatcher
from cutetune.spaces.models import load_model


def test_every_op_is_timed_on_its_fast_path(monkeypatch, capsys):
    monkeypatch.setattr(fast_path_host, "CALLS", 20)
    monkeypatch.setattr(fast_path_host, "ROUNDS", 1)
    fast_path_host.main()
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line[:26].strip() for line in lines] == [*fast_path_host.op_calls(), "t.shape"]
    assert all(line.endswith(" us") for line in lines)


def test_the_script_puts_back_what_it_changed(monkeypatch):
    """CPU tensors are on the CPU again, and the current dispatcher is no longer its own."""
    monkeypatch.setattr(fast_path_host, "CALLS", 1)
    monkeypatch.setattr(fast_path_host, "ROUNDS", 1)
    fast_path_host.main()
    assert torch.zeros(1).get_device() == -1
    assert current_dispatcher().spec is None  # not the H200 one the script served from


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

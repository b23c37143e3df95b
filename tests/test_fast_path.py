"""The ops' fast path (cutetune.dispatch): after an op's checked path has served a CUDA call,
calls with the same input signature skip the op's checks and go straight to the launcher the
dispatcher serves; a call the launcher refuses, one whose written rows overlap, and one served
by the default take the checked path. Checked on the CPU: the tensors pass for CUDA ones, and
the launchers are stand-ins that record their calls (and refuse what TVM-FFI would)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
import torch

from cutetune import dispatch
from cutetune.dispatch import Dispatcher
from cutetune.kernels import qk_norm as qk
from cutetune.ops import activation, moe_combine, moe_dispatch, qk_norm, rmsnorm
from cutetune.spaces.buckets import BUCKETS, MAX_BUCKET


class Launcher:
    """A compiled kernel's stand-in: records the tensors of each call; refuses, with the
    error type TVM-FFI raises, the calls whose tensors do not share the first one's dtype
    (int32 and fp32 tensors aside, as the MoE kernels take them)."""

    def __init__(self):
        self.calls = []

    def __call__(self, *tensors):
        rows = [t for t in tensors if isinstance(t, torch.Tensor)
                and t.dtype not in (torch.int32, torch.float32)]
        if any(t.dtype is not rows[0].dtype for t in rows):
            raise ValueError("Mismatched Tensor on argument #1, expected dtype=bfloat16")
        self.calls.append(tensors)


@dataclass
class Served:
    launcher: Launcher
    dispatcher: Dispatcher
    default_buckets: set[int] = field(default_factory=set)


@pytest.fixture
def served(monkeypatch) -> Served:
    """The current dispatcher, serving one Launcher at every bucket of every static problem
    (the default at the buckets in `default_buckets`), with CPU tensors taken for CUDA ones."""
    served = Served(Launcher(), Dispatcher(None))

    def install(self, kernel, problem, warmed_up, key):
        row = tuple((served.launcher, bucket in served.default_buckets) for bucket in BUCKETS)
        self._rows[key] = row
        return row

    monkeypatch.setattr(Dispatcher, "_install", install)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(moe_dispatch, "_workspace", lambda device, local: None)
    monkeypatch.setattr(dispatch, "_current", served.dispatcher)
    return served


def bf16(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


def ids(tokens, top_k=8):
    return torch.zeros(tokens, top_k, dtype=torch.int32)


OPS = {
    "silu_and_mul": (activation, lambda t: activation.silu_and_mul(bf16(t, 3072),
                                                                   out=bf16(t, 1536))),
    "gelu_and_mul": (activation, lambda t: activation.gelu_and_mul(bf16(t, 3072),
                                                                   approximate="tanh")),
    "rmsnorm": (rmsnorm, lambda t: rmsnorm.rmsnorm(bf16(t, 4096), bf16(4096))),
    "fused_add_rmsnorm": (rmsnorm, lambda t: rmsnorm.fused_add_rmsnorm(
        bf16(t, 4096), bf16(t, 4096), bf16(4096), eps=1e-5)),
    "qk_norm": (qk_norm, lambda t: qk_norm.qk_norm(bf16(t, 32, 128), bf16(t, 8, 128),
                                                   bf16(128), bf16(128))),
    "moe_dispatch": (moe_dispatch, lambda t: moe_dispatch.moe_dispatch(
        bf16(t, 2048), ids(t), 128, expert_range=(32, 96))),
    "moe_combine": (moe_combine, lambda t: moe_combine.moe_combine(
        bf16(t * 8 + 64 * 15, 2048), ids(t), torch.zeros(t, 8), experts=128)),
}


def counting_checks(monkeypatch, module) -> list:
    checked = []
    check = module._check_inputs

    def counted(*args):
        checked.append(args)
        return check(*args)

    monkeypatch.setattr(module, "_check_inputs", counted)
    return checked


@pytest.mark.parametrize("op", OPS)
def test_later_calls_of_a_signature_skip_the_checks(op, served, monkeypatch):
    module, call = OPS[op]
    checked = counting_checks(monkeypatch, module)
    call(3)
    call(5)
    call(1)
    assert len(checked) == 1
    assert len(served.launcher.calls) == 3


@pytest.mark.parametrize("op", OPS)
def test_a_new_dispatcher_starts_from_the_checked_path(op, served, monkeypatch):
    module, call = OPS[op]
    call(2)
    monkeypatch.setattr(dispatch, "_current", Dispatcher(None))
    checked = counting_checks(monkeypatch, module)
    call(2)
    assert len(checked) == 1


def test_a_call_the_launcher_refuses_gets_the_checks_error(served):
    x = bf16(4, 3072)
    activation.silu_and_mul(x, out=bf16(4, 1536))
    with pytest.raises(TypeError, match="out has dtype torch.float16 but x has torch.bfloat16"):
        activation.silu_and_mul(x, out=torch.zeros(4, 1536, dtype=torch.float16))
    assert len(served.launcher.calls) == 1


def test_moe_dispatch_into_given_buffers_allocates_nothing(served, monkeypatch):
    x, topk_ids = bf16(3, 2048), ids(3)
    out = moe_dispatch.moe_dispatch_buffers(x, topk_ids, 128)
    allocated = []
    allocate = moe_dispatch._allocate
    monkeypatch.setattr(moe_dispatch, "_allocate",
                        lambda *args: allocated.append(args) or allocate(*args))
    for _ in range(3):
        assert moe_dispatch.moe_dispatch(x, topk_ids, 128, out=out) is out
    assert allocated == [] and len(served.launcher.calls) == 3
    assert served.launcher.calls[-1][2:7] == (out.row_of, out.dispatched, out.counts,
                                              out.offsets, out.error)


def test_too_few_dispatched_rows_take_the_checked_path(served):
    x, topk_ids = bf16(3, 2048), ids(3)
    out = moe_dispatch.moe_dispatch_buffers(x, topk_ids, 128)
    moe_dispatch.moe_dispatch(x, topk_ids, 128, out=out)
    short = dataclasses.replace(out, dispatched=out.dispatched[:-1])
    with pytest.raises(ValueError, match=r"out.dispatched must be \(rows, 2048\) with rows >= "):
        moe_dispatch.moe_dispatch(x, topk_ids, 128, out=short)
    assert len(served.launcher.calls) == 1


def test_overlapping_written_rows_take_the_checked_path(served):
    x, weight = bf16(4, 4096), bf16(4096)
    rmsnorm.rmsnorm(x, weight, out=bf16(4, 4096))
    overlapping = bf16(1, 4096).expand(4, 4096)
    with pytest.raises(ValueError, match="non-overlapping rows"):
        rmsnorm.rmsnorm(x, weight, out=overlapping)
    expert_out, row_of, weights = bf16(4 * 8 + 64 * 15, 2048), ids(4), torch.zeros(4, 8)
    moe_combine.moe_combine(expert_out, row_of, weights, bf16(4, 2048), experts=128)
    with pytest.raises(ValueError, match="out's not overlapping"):
        moe_combine.moe_combine(expert_out, row_of, weights, bf16(1, 2048).expand(4, 2048),
                                experts=128)
    assert len(served.launcher.calls) == 2


def test_calls_served_by_the_default_take_the_checked_path_and_are_counted(served,
                                                                           monkeypatch):
    served.default_buckets = {4}
    checked = counting_checks(monkeypatch, activation)
    for tokens in (4, 3, 4, 2):
        activation.silu_and_mul(bf16(tokens, 3072))
    assert len(checked) == 3  # the first call, then each call of the default bucket 4
    assert sum(served.dispatcher.default_calls().values()) == 3


def _qk_row(dispatcher, signature):
    dispatcher.lookup(qk.KERNEL, ("bfloat16", 128, 32, 8, 1e-6, 0.0), 1, signature)


def test_fast_lookup_serves_a_remembered_signature_within_the_buckets(served):
    signature = ("qk_norm", torch.bfloat16, 32, 128, 8, 1e-6, 0.0)
    dispatcher = served.dispatcher
    assert dispatch.fast_lookup(signature, 1) is None  # not remembered yet
    _qk_row(dispatcher, signature)
    assert dispatch.fast_lookup(signature, 1) is served.launcher
    assert dispatch.fast_lookup(signature, MAX_BUCKET) is served.launcher
    assert dispatch.fast_lookup(signature, 0) is None
    assert dispatch.fast_lookup(signature, MAX_BUCKET + 1) is None
    assert dispatch.fast_lookup((*signature[:-1], 1.0), 1) is None


def test_fast_lookup_before_any_dispatcher_sends_the_call_down_the_checked_path(monkeypatch):
    monkeypatch.setattr(dispatch, "_current", None)
    assert dispatch.fast_lookup(("qk_norm", torch.bfloat16, 32, 128, 8, 1e-6, 0.0), 1) is None

"""Each public op's dispatcher key is its kernel's Problem key (`Problem.static_tuple`) for the
problem its inputs describe: built from the Problem's declaration (`static_tuple_of`), so the
op and the dispatcher cannot disagree about the field order. Checked on the CPU: the tensors
pass for CUDA ones, and the op stops at its lookup."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from cutetune.kernels.activation import GeluAndMulProblem, SiluAndMulProblem
from cutetune.kernels.moe_common import MoEProblem
from cutetune.kernels.qk_norm import QKNormProblem
from cutetune.kernels.rmsnorm import RMSNormProblem
from cutetune.ops import activation, moe_combine, moe_dispatch, qk_norm, rmsnorm
from cutetune.spaces.problem import Problem


class Looked(Exception):
    """Raised by the stand-in dispatcher with what the op looked up."""


class RecordingDispatcher:
    def lookup(self, kernel, static_tuple, num_tokens, route=None, arguments=()):
        raise Looked(kernel.problem_type.from_static_tuple(static_tuple, num_tokens),
                     static_tuple)


def bf16(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


CASES = [
    (qk_norm, lambda: qk_norm.qk_norm(bf16(5, 32, 128), bf16(5, 8, 128), bf16(128), bf16(128),
                                      eps=1e-5, weight_bias=1.0),
     QKNormProblem(num_tokens=5, dtype="bfloat16", head_dim=128, q_heads=32, kv_heads=8,
                   eps=1e-5, weight_bias=1.0)),
    (rmsnorm, lambda: rmsnorm.fused_add_rmsnorm(bf16(3, 4096), bf16(3, 4096), bf16(4096),
                                                out_dtype=torch.float32),
     RMSNormProblem(num_tokens=3, dtype="bfloat16", out_dtype="float32", hidden=4096,
                    eps=1e-6, weight_bias=0.0, fused_add=True)),
    (activation, lambda: activation.silu_and_mul(bf16(7, 2 * 1536)),
     SiluAndMulProblem(num_tokens=7, dtype="bfloat16", intermediate=1536)),
    (activation, lambda: activation.gelu_and_mul(bf16(7, 2 * 1536), approximate="tanh"),
     GeluAndMulProblem(num_tokens=7, dtype="bfloat16", intermediate=1536, approximate="tanh")),
    (moe_dispatch, lambda: moe_dispatch.moe_dispatch(
        bf16(4, 2048), torch.zeros(4, 8, dtype=torch.int32), 128, pad=16,
        expert_range=(32, 96), zero_padding=True),
     MoEProblem(num_tokens=4, dtype="bfloat16", hidden=2048, experts=128, top_k=8, pad=16,
                expert_begin=32, expert_end=96, zero_padding=True)),
    (moe_combine, lambda: moe_combine.moe_combine(
        bf16(4 * 8 + 64 * 15, 2048), torch.zeros(4, 8, dtype=torch.int32),
        torch.zeros(4, 8), experts=128, expert_begin=32, expert_end=96),
     MoEProblem(num_tokens=4, dtype="bfloat16", hidden=2048, experts=128, top_k=8, pad=16,
                expert_begin=32, expert_end=96, zero_padding=False)),
]


@pytest.mark.parametrize(("module", "call", "expected"), CASES,
                         ids=["qk_norm", "fused_add_rmsnorm", "silu_and_mul", "gelu_and_mul",
                              "moe_dispatch", "moe_combine"])
def test_the_op_looks_up_its_problems_key(module, call, expected, monkeypatch):
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(module, "current_dispatcher", RecordingDispatcher)
    monkeypatch.setattr(moe_dispatch, "_workspace", lambda device, local: None)
    with pytest.raises(Looked) as looked:
        call()
    problem, static_tuple = looked.value.args
    assert problem == expected
    assert static_tuple == expected.static_tuple()


def test_a_key_names_every_static_field():
    with pytest.raises(TypeError, match="static fields are dtype, intermediate; got dtype"):
        SiluAndMulProblem.static_tuple_of(dtype="bfloat16")
    with pytest.raises(TypeError, match="static fields are dtype, intermediate; got dtype, width"):
        SiluAndMulProblem.static_tuple_of(dtype="bfloat16", width=1536)
    key = SiluAndMulProblem.static_tuple_of(intermediate=1536, dtype="bfloat16")
    assert key == ("bfloat16", 1536)
    assert SiluAndMulProblem.from_static_tuple(key, 9) == SiluAndMulProblem(
        num_tokens=9, dtype="bfloat16", intermediate=1536)


def test_a_problem_of_one_static_field_has_a_one_field_key():
    @dataclass(frozen=True, kw_only=True)
    class WidthOnly(Problem):
        width: int

    key = WidthOnly.static_tuple_of(width=3)
    assert key == (3,) == WidthOnly(num_tokens=1, width=3).static_tuple()

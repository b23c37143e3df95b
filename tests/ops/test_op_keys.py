"""Each public op's dispatcher key is its kernel's Problem key (`Problem.static_tuple`) for the
problem its inputs describe: built from the Problem's declaration (`static_tuple_of`), so the
op and the dispatcher cannot disagree about the field order. Checked on the CPU for every op and
every static problem the models give its kernel: the tensors pass for CUDA ones, and the op
stops at its lookup."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from cutetune.kernels.activation import SiluAndMulProblem
from cutetune.ops import moe_dispatch, serve
from cutetune.spaces.problem import Problem
from testkit.op_problems import op_problems, public_calls


class Looked(Exception):
    """Raised by the stand-in dispatcher with what the op looked up."""


class RecordingDispatcher:
    def serving(self, kernel, static_tuple, num_tokens):
        raise Looked(kernel.problem_type.from_static_tuple(static_tuple, num_tokens),
                     static_tuple)


@pytest.mark.parametrize(("op", "problem"), op_problems(),
                         ids=[f"{op.name}-{problem.static_key()}" for op, problem in op_problems()])
def test_the_op_looks_up_its_problems_key(op, problem, monkeypatch):
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(moe_dispatch, "_workspace", lambda device, local: None)
    monkeypatch.setattr(serve, "current_dispatcher", RecordingDispatcher)
    expected = problem.with_tokens(5)
    for call in public_calls(op, problem, 5).values():
        with pytest.raises(Looked) as looked:
            call()
        looked_up, static_tuple = looked.value.args
        assert looked_up == expected
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

"""Every registered op (cutetune.ops.registry) with the static problems real models give its
kernel: those of the presets and of the committed Hugging Face configs (testkit.model_problems),
one per static key. The tests that cover every op iterate these, so that a new op is covered
once it is registered."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

import cutetune.ops  # noqa: F401  (registers every op)
from cutetune.kernels.registry import Tensors
from cutetune.ops.registry import OpDef, ops
from cutetune.spaces.problem import Problem
from testkit.model_problems import model_problems


@functools.cache
def op_problems() -> tuple[tuple[OpDef, Problem], ...]:
    """(op, static problem) for every static problem of every op's kernel the models give."""
    found = []
    for op in ops():
        problems = {p.static_key(): p for p in model_problems(op.kernel)}
        for variant in (v for p in list(problems.values()) for v in _variants(op.name, p)):
            problems.setdefault(variant.static_key(), variant)
        found += [(op, problem) for problem in problems.values()]
    return tuple(found)


def _variants(op_name: str, problem: Problem) -> list[Problem]:
    """Static fields no model config sets but callers do: a float32 output of the fused
    norm, a rank's slice of the experts, zeroed padding rows (dispatch's), FP8 scales
    row-major and powers of two in groups of 64."""
    fields = problem.static_fields()
    if "column_major_scales" in fields:
        return [dataclasses.replace(problem, column_major_scales=False, ue8m0=True,
                                    group_size=64)]
    if fields.get("fused_add"):
        return [dataclasses.replace(problem, out_dtype="float32")]
    if "expert_begin" in fields and fields["experts"] >= 4:
        quarter = fields["experts"] // 4
        zeroed = (False, True) if op_name == "moe_dispatch" else (False,)
        return [dataclasses.replace(problem, expert_begin=quarter, expert_end=3 * quarter,
                                    zero_padding=zero) for zero in zeroed]
    return []


@functools.cache
def call_problems() -> dict[str, tuple[OpDef, Problem]]:
    """For each public call of the ops (by OpDef.calls' name), the first op and problem that
    make it."""
    found: dict[str, tuple[OpDef, Problem]] = {}
    for op, problem in op_problems():
        for name in public_calls(op, problem, 1):
            found.setdefault(name, (op, problem))
    return found


def public_calls(op: OpDef, problem: Problem, tokens: int) -> dict[str, Callable[[], Any]]:
    """The op's public calls, by name, of fresh CPU inputs of `problem` at `tokens` tokens."""
    at = problem.with_tokens(tokens)
    return dict(op.calls(op.kernel.make_inputs(at, "cpu", torch.Generator().manual_seed(0)), at))


def written_outputs(op: OpDef, problem: Problem, tensors: Tensors, returned: Any) -> Tensors:
    """The kernel's tensors a call of op.calls(tensors, problem) was given, with the outputs
    it wrote: those it returned where the op allocates them (OpDef.returned)."""
    if op.returned is None:
        return tensors
    return {**tensors, **op.returned(returned, problem)}


def public_call(name: str, tokens: int) -> Callable[[], Any]:
    """The public call `name` (a key of call_problems) of fresh inputs at `tokens` tokens."""
    op, problem = call_problems()[name]
    return public_calls(op, problem, tokens)[name]

"""The models the tests take a kernel's problems from: the presets, then the Hugging Face configs
committed under tests/data/hf_configs, which give a problem to the kernels no preset uses
(gelu_and_mul: the Gemma configs; mxfp8_quant: Qwen3-8B-MXFP8). The suites that cover every
kernel or op ask here, so that a kernel is covered once a preset or a committed config uses
it."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path

from cutetune.kernels.registry import KernelDef, NotApplicableError
from cutetune.spaces.models import PRESET_NAMES, PRESETS, ModelShape, load_model
from cutetune.spaces.problem import Problem

HF_CONFIGS = Path(__file__).resolve().parents[1] / "tests" / "data" / "hf_configs"


@functools.cache
def presets() -> tuple[ModelShape, ...]:
    return tuple(PRESETS[name] for name in PRESET_NAMES)


@functools.cache
def committed_configs() -> tuple[ModelShape, ...]:
    return tuple(load_model(str(path)) for path in sorted(HF_CONFIGS.glob("*.json")))


def problems_by_model(kernel: KernelDef, dtype: str = "bfloat16") -> list[list[Problem]]:
    """The static problems each model that applies to the kernel gives it: the presets', by
    name, then the committed configs', by file name; AssertionError where none applies."""
    found = _given(kernel, (*presets(), *committed_configs()), dtype)
    assert found, f"no model in the presets or {HF_CONFIGS} gives {kernel.name} a problem"
    return found


def first_model_problems(kernel: KernelDef, dtype: str = "bfloat16") -> list[Problem]:
    """The static problems of the first model that applies to the kernel."""
    return problems_by_model(kernel, dtype)[0]


def model_problems(kernel: KernelDef, dtype: str = "bfloat16") -> list[Problem]:
    """Every static problem the models give the kernel, one per static key, in the models'
    order."""
    return _unique(problems_by_model(kernel, dtype))


def preset_problems(kernel: KernelDef, dtype: str = "bfloat16") -> list[Problem]:
    """Every static problem the presets give the kernel, one per static key; where no preset
    applies, the committed configs'."""
    return _unique(_given(kernel, presets(), dtype) or problems_by_model(kernel, dtype))


def _given(kernel: KernelDef, models: Iterable[ModelShape], dtype: str) -> list[list[Problem]]:
    found = []
    for model in models:
        try:
            found.append(kernel.problems_for_model(model, dtype))
        except NotApplicableError:
            continue
    return found


def _unique(by_model: list[list[Problem]]) -> list[Problem]:
    unique: dict[str, Problem] = {}
    for problems in by_model:
        for problem in problems:
            unique.setdefault(problem.static_key(), problem)
    return list(unique.values())

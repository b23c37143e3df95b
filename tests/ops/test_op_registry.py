"""The op registry: every op module registers its op; `cutetune.<name>` and torch.ops.cutetune
read it, and nothing else lists the ops."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

import cutetune
from cutetune.ops.registry import get_op, ops, public_functions, register


def test_every_public_function_is_an_attribute_of_cutetune():
    assert public_functions()
    for name, function in public_functions().items():
        assert getattr(cutetune, name) is function
    assert set(public_functions()) <= set(cutetune.__all__)


def test_every_custom_op_is_a_torch_op():
    for op in ops():
        for custom in op.custom_ops:
            assert getattr(torch.ops.cutetune, custom.name).default._schema.name == (
                f"cutetune::{custom.name}")


def test_an_op_is_registered_once():
    with pytest.raises(ValueError, match="op 'qk_norm' is registered twice"):
        register(get_op("qk_norm"))


def test_an_output_is_an_argument_of_the_call_that_prepare_makes():
    silu = get_op("silu_and_mul")
    with pytest.raises(ValueError, match="output 'y' must be an argument of its fast call"):
        dataclasses.replace(silu, output="y")
    with pytest.raises(ValueError, match="output 'out' must be an argument of its fast call, "
                                         "made by its prepare"):
        dataclasses.replace(silu, prepare=None)


def test_an_unknown_name_is_one_clear_error():
    with pytest.raises(AttributeError, match="module 'cutetune' has no attribute 'rms_norm'"):
        cutetune.rms_norm  # noqa: B018
    with pytest.raises(LookupError, match="unknown op 'rms_norm': known ops are "):
        get_op("rms_norm")


def test_asking_for_a_module_or_a_private_name_imports_no_op():
    """`from cutetune import cli` asks the package for `cli` before importing it: the CLI must
    not pay for torch and every op there."""
    done = subprocess.run([sys.executable, "-c", (
        "import sys, cutetune\n"
        "assert not hasattr(cutetune, '_private')\n"
        "from cutetune import settings\n"
        "print('torch' in sys.modules, 'cutetune.ops' in sys.modules)\n")],
        capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]

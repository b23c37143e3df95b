"""Every public call of every op (OpDef.calls), as the fast path's GPU tests make it, computes its
kernel's reference: on the CPU, where the op writes the reference, judged by the kernel's check
in the tensors the call was given or, for a call that allocates its outputs, in those it returns
(OpDef.returned; testkit.op_problems.written_outputs, which the GPU tests read them by)."""

from __future__ import annotations

import pytest
import torch

from cutetune.device.verify import check_outputs
from testkit.op_problems import call_problems, written_outputs


@pytest.mark.parametrize("name", sorted(call_problems()))
def test_a_call_writes_the_reference_where_the_tests_read_it(name):
    op, static = call_problems()[name]
    problem = static.with_tokens(3)
    tensors = op.kernel.make_inputs(problem, "cpu", torch.Generator().manual_seed(0))
    expected = op.kernel.reference(tensors, problem)
    returned = op.calls(tensors, problem)[name]()
    check_outputs(op.kernel, problem, written_outputs(op, problem, tensors, returned), expected)

"""The ops' fast path on the GPU: with every bucket served by a tuned kernel (each bucket's
default marked tuned), each public op's call after the first goes through its route (C++) to
the kernel, and computes what the fp32 reference does: on a side stream (torch's current
stream, which the route's call takes) and replayed in a CUDA graph captured there."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cutetune.device.specs import device_spec_for
from cutetune.device.verify import check_outputs
from cutetune.ops.registry import get_op, ops
from cutetune.serving.plan import DEFAULT, TUNED, ServingPlan
from cutetune.serving.table import Dispatcher
from cutetune.serving.warmup import set_current
from testkit.compiled_points import compile_all, compiled
from testkit.model_problems import first_model_problems
from testkit.op_problems import written_outputs
from testkit.routed import routed

pytestmark = pytest.mark.gpu
TOKENS = 5


@pytest.fixture
def all_tuned(monkeypatch):
    """The current dispatcher, serving each bucket's default as if tuned (so the routes serve
    every bucket), its points compiled once for the session."""
    plan = ServingPlan._plan

    def tuned(self, kernel, problem, predicted):
        entries = plan(self, kernel, problem, predicted)
        compile_all(kernel, problem, {e.config for e in entries})
        return tuple(dataclasses.replace(e, source=TUNED) if e.source == DEFAULT else e
                     for e in entries)

    monkeypatch.setattr(ServingPlan, "_plan", tuned)
    monkeypatch.setattr(Dispatcher, "compiled",
                        lambda self, kernel, problem, config: compiled(kernel, problem, config))
    set_current(Dispatcher(device_spec_for(torch.cuda.get_device_name())))
    yield
    set_current(None)


def _problems(kernel) -> list:
    """The static problems of the first model that applies to the kernel, at TOKENS."""
    return [p.with_tokens(TOKENS) for p in first_model_problems(kernel)]


def _inputs(kernel, problem, seed: int):
    device = torch.device("cuda")
    tensors = kernel.make_inputs(problem, device, torch.Generator(device).manual_seed(seed))
    return tensors, kernel.reference(tensors, problem)


@pytest.mark.parametrize("name", sorted(op.name for op in ops()))
def test_routed_calls_compute_the_reference_on_a_side_stream_and_in_a_graph(name, all_tuned):
    kernel = get_op(name).kernel
    for problem in _problems(kernel):
        tensors, _ = _inputs(kernel, problem, seed=0)
        for op in get_op(name).calls(tensors, problem):
            _check_routed(kernel, problem, op)


def _check_routed(kernel, problem, op: str) -> None:
    op_calls = get_op(kernel.name).calls
    tensors, _ = _inputs(kernel, problem, seed=0)
    op_calls(tensors, problem)[op]()  # the checked path, which tells the route
    torch.cuda.synchronize()

    # The inputs are drawn on the current stream: the side stream waits for them.
    tensors, expected = _inputs(kernel, problem, seed=1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    returned = []
    with torch.cuda.stream(stream):
        assert routed(lambda: returned.append(op_calls(tensors, problem)[op]())), op
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    check_outputs(kernel, problem, written_outputs(get_op(kernel.name), problem, tensors,
                                                   returned[0]), expected)

    warm, _ = _inputs(kernel, problem, seed=3)
    tensors, expected = _inputs(kernel, problem, seed=2)
    graph = torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        op_calls(warm, problem)[op]()  # the usual warm-up on the capture stream
        call = op_calls(tensors, problem)[op]
        with torch.cuda.graph(graph, stream=stream):
            captured = call()
        graph.replay()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    check_outputs(kernel, problem, written_outputs(get_op(kernel.name), problem, tensors,
                                                   captured), expected)

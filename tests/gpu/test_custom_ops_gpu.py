"""The decoder block of tests/ops/test_custom_ops.py on the GPU: compiled with
torch.compile(fullgraph=True) it computes what it computes eagerly, and so does the compiled
block replayed in a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from testkit.decoder_block import DecoderBlock, inputs

pytestmark = pytest.mark.gpu


def _cuda_inputs(seed: int):
    torch.manual_seed(seed)
    tensors = [t.cuda() for t in inputs()]
    tensors[7] = torch.randint(0, 8, tensors[7].shape, dtype=torch.int32, device="cuda")
    return tensors


def _run(block, seed: int):
    tensors = _cuda_inputs(seed)
    outputs = block(*tensors)
    torch.cuda.synchronize()
    return [o.clone() for o in outputs]


def test_compiled_and_graphed_blocks_compute_what_the_eager_one_does():
    eager = _run(DecoderBlock(), seed=1)
    compiled_block = torch.compile(DecoderBlock(), fullgraph=True)
    compiled = _run(compiled_block, seed=1)
    # Every returned output is independent of the order dispatch gives rows within an expert
    # (combine reads each pair's own row), so the runs agree bit for bit.
    for i, (a, b) in enumerate(zip(eager, compiled, strict=True)):
        assert torch.equal(a, b), f"output {i}"

    tensors = _cuda_inputs(seed=1)
    compiled_block(*tensors)  # warm-up on the side: compiles, allocates the workspace
    tensors = _cuda_inputs(seed=1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = compiled_block(*tensors)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured[6], eager[6], rtol=0, atol=0)

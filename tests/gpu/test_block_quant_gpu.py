"""mxfp8_quant and nvfp4_quant on the GPU (sm_90a: e4m3 by cvt, e2m1 by the integer rounding):
every covering point (every valid point under the `sweep` marker) bit for bit against the torch
reference (values and scales, the swizzled padding too) on inputs with all-zero blocks, denormal
inputs, saturation edges and rounding ties; dynamic token counts across the 128-row tiles;
NaN and Inf blocks; and the public ops."""

from __future__ import annotations

import re

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.device.verify import check_outputs, poison, verify
from cutetune.kernels.block_quant import (
    E4M3_NAN,
    E8M0_NAN,
    MXFP8_KERNEL,
    NVFP4_KERNEL,
    PACKING,
    BlockQuantConfig,
    MXFP8QuantProblem,
    NVFP4QuantProblem,
    quantised,
)
from cutetune.ops.block_quant import mxfp8_quant, nvfp4_quant
from testkit.compiled_points import compile_all, compiled
from testkit.covering_points import WHICH_POINTS, selected_points
from testkit.every_point import assert_every_point

pytestmark = pytest.mark.gpu

H200 = DEVICE_SPECS["H200"]
CUDA = torch.device("cuda")
# Ragged: 133 rows pass one 128-row tile of the swizzled scales, and leave the last thread block
# partial.
TOKENS = 133


def _kernel(problem):
    return MXFP8_KERNEL if problem.format == "mxfp8" else NVFP4_KERNEL


PROBLEMS = [
    kind(num_tokens=TOKENS, dtype=dtype, hidden=hidden, scale_layout=layout)
    for kind, hidden in ((MXFP8QuantProblem, 4096), (NVFP4QuantProblem, 4096),
                         # scale columns 3 and 5: the swizzled scales' padded columns
                         (MXFP8QuantProblem, 96), (NVFP4QuantProblem, 80))
    for dtype in ("bfloat16", "float16")
    for layout in ("swizzled", "row_major")
]


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{p.format}-{p.describe()}")
def test_points_match_reference_bit_for_bit(problem, which):
    kernel = _kernel(problem)
    points = selected_points(which, kernel, problem, H200)
    assert points and {c.vector_bits for c in points} == {64, 128}
    compile_all(kernel, problem, points)
    assert_every_point(points, lambda i, config: verify(
        kernel, problem, compiled(kernel, problem, config), CUDA, seed=i), problem.describe())


@pytest.mark.parametrize("config", [BlockQuantConfig(128, 1, 1), BlockQuantConfig(64, 4, 8)],
                         ids=["128bit-1warp", "64bit-4x8warps"])
@pytest.mark.parametrize("tokens", [1, 2, 127, 128, 129, 1000, 4097])
@pytest.mark.parametrize("kind", [MXFP8QuantProblem, NVFP4QuantProblem])
def test_token_count_is_dynamic(kind, tokens, config):
    problem = kind(num_tokens=1, dtype="bfloat16", hidden=7168, scale_layout="swizzled")
    kernel = _kernel(problem)
    verify(kernel, problem.with_tokens(tokens), compiled(kernel, problem, config), CUDA,
           seed=tokens)


def _special_rows(block: int) -> torch.Tensor:
    """One block per row: a NaN among ones, -inf among ones, +inf with a NaN, all zeros, -0
    and +0 mixed, denormals of bf16, and e2m1's ties at scale 1 (amax 6)."""
    rows = torch.ones(8, block)
    rows[0, 3] = float("nan")
    rows[1, 5] = -float("inf")
    rows[2, 0], rows[2, 1] = float("inf"), float("nan")
    rows[3] = 0.0
    rows[4, ::2] = -0.0
    rows[4, 1::2] = 0.0
    rows[5] = torch.finfo(torch.bfloat16).tiny * torch.linspace(-0.9, 0.9, block)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    rows[6] = torch.cat([ties, -ties]).repeat(block // 16)
    rows[7] = 448.0 * torch.linspace(-1.2, 1.2, block)
    return rows.to(torch.bfloat16)


@pytest.mark.parametrize("config", [BlockQuantConfig(64, 1, 1), BlockQuantConfig(128, 2, 4)],
                         ids=["64bit", "128bit"])
@pytest.mark.parametrize("kind", [MXFP8QuantProblem, NVFP4QuantProblem])
def test_nan_inf_zero_denormal_and_ties(kind, config):
    problem = kind(num_tokens=8, dtype="bfloat16", hidden=32, scale_layout="row_major")
    kernel = _kernel(problem)
    x = _special_rows(32).to(CUDA)
    tensors = {"x": x, "global_scale": torch.ones(1, device=CUDA)}
    expected = kernel.reference(tensors, problem)
    fmt = problem.format
    tensors["q"] = torch.empty_like(expected["q"])
    tensors["scales"] = torch.empty_like(expected["scales"])
    poison(tensors["q"])
    poison(tensors["scales"])
    kernel.launch(compiled(kernel, problem, config), tensors)
    torch.cuda.synchronize()
    check_outputs(kernel, problem, tensors, expected)
    scales = tensors["scales"].view(torch.uint8)
    nan_scale = E8M0_NAN if fmt == "mxfp8" else E4M3_NAN
    # A block holding a NaN: the NaN scale and +0 elements.
    assert int(scales[0, 0]) == int(scales[2, 0]) == nan_scale
    first_block = tensors["q"].view(torch.uint8)[0, :problem.block // PACKING[fmt]]
    assert int(first_block.count_nonzero()) == 0


@pytest.mark.parametrize("layout", ["swizzled", "row_major"])
def test_public_ops_match_the_reference(layout):
    g = torch.Generator(CUDA).manual_seed(0)
    x = (4 * torch.randn(300, 2048, device=CUDA, generator=g)).to(torch.bfloat16)
    global_scale = torch.tensor([448.0 * 6 / 16], device=CUDA)
    for op, kind in ((lambda: mxfp8_quant(x, layout), MXFP8QuantProblem),
                     (lambda: nvfp4_quant(x, global_scale, layout), NVFP4QuantProblem)):
        q, scales = op()
        problem = kind(num_tokens=300, dtype="bfloat16", hidden=2048, scale_layout=layout)
        want_q, want_scales = quantised(x, problem, global_scale)
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
        assert torch.equal(scales.view(torch.uint8), want_scales.view(torch.uint8))
        # Again: the fast path's call, now that the route remembers the key.
        again_q, again_scales = op()
        assert torch.equal(again_q.view(torch.uint8), want_q.view(torch.uint8))
        assert torch.equal(again_scales.view(torch.uint8), want_scales.view(torch.uint8))


@pytest.mark.parametrize(("bad", "error", "message"), [
    (lambda: {"q": torch.empty(5, 256, device=CUDA, dtype=torch.bfloat16)}, TypeError,
     "q has dtype torch.bfloat16: it must be torch.float8_e4m3fn"),
    (lambda: {"q": torch.empty(4, 256, device=CUDA, dtype=torch.float8_e4m3fn)}, ValueError,
     "q must have shape (5, 256), got (4, 256)"),
    (lambda: {"scales": torch.empty(128, 8, device=CUDA, dtype=torch.uint8)}, TypeError,
     "scales has dtype torch.uint8: it must be torch.float8_e8m0fnu"),
    (lambda: {"scales": torch.empty(5, 8, device=CUDA, dtype=torch.float8_e8m0fnu)}, ValueError,
     "scales must have shape (128, 8), got (5, 8)"),
], ids=["q-dtype", "q-shape", "scales-dtype", "scales-shape"])
def test_public_op_refuses_bad_buffers_after_a_good_call(bad, error, message):
    # The good calls make the route serve this key; a buffer of the wrong dtype or shape must
    # still meet the op's checks, not be written past its end.
    x = torch.randn(5, 256, device=CUDA).to(torch.bfloat16)
    for _ in range(2):
        mxfp8_quant(x, q=torch.empty(5, 256, device=CUDA, dtype=torch.float8_e4m3fn),
                    scales=torch.empty(128, 8, device=CUDA, dtype=torch.float8_e8m0fnu))
    with pytest.raises(error, match=re.escape(message)):
        mxfp8_quant(x, **bad())

"""The FP8 group-quant kernels on the GPU against the torch reference, values and scales
(fp8_group_quant bit-exactly, the fused kernels by fp8_quant.check_fused): the covering points
(every valid point under the `sweep` marker) of each kernel on problems that take every code
path (groups of 64 and 128, row- and column-major and UE8M0 scales, bf16 and fp16, the norm's
forms and ragged rows, the fused add), on random rows with edge-case groups (all zero, below
the floor, subnormal, at the saturation edge and e4m3's ties); dynamic token counts; NaN and
infinity; padded rows; the public ops, and the fused ops against the unfused chains of the
public ops (silu's bit-exactly: the same elementwise instructions; the norm's within
fp8_quant.check_fused's rounding step, its reduction order being each config's)."""

from __future__ import annotations

import re

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.device.verify import verify
from cutetune.kernels.fp8_group_quant import (
    QUANT_KERNEL,
    SILU_QUANT_KERNEL,
    FP8GroupQuantProblem,
    GroupQuantConfig,
    SiluAndMulFP8QuantProblem,
)
from cutetune.kernels.fp8_quant import FP8_DTYPE, check_exact, check_fused
from cutetune.kernels.rmsnorm import BLOCK_PER_ROW, WARP_PER_ROW, RMSNormConfig
from cutetune.kernels.rmsnorm_fp8_quant import KERNEL as NORM_KERNEL
from cutetune.kernels.rmsnorm_fp8_quant import RMSNormFP8QuantProblem
from cutetune.ops.activation import silu_and_mul
from cutetune.ops.fp8_quant import (
    fp8_group_quant,
    fused_add_rmsnorm_fp8_quant,
    rmsnorm_fp8_quant,
    silu_and_mul_fp8_quant,
)
from cutetune.ops.rmsnorm import fused_add_rmsnorm, rmsnorm
from testkit.compiled_points import compile_all, compiled
from testkit.covering_points import WHICH_POINTS, selected_points
from testkit.every_point import assert_every_point

pytestmark = pytest.mark.gpu

H200 = DEVICE_SPECS["H200"]
CUDA = torch.device("cuda")
# Ragged: the last block of every kernel is partial.
TOKENS = 37


def _quant(hidden, dtype="bfloat16", group=128, column_major=True, ue8m0=False, tokens=TOKENS):
    return FP8GroupQuantProblem(num_tokens=tokens, dtype=dtype, hidden=hidden, group_size=group,
                                column_major_scales=column_major, ue8m0=ue8m0)


def _silu(intermediate, dtype="bfloat16", group=128, column_major=True, ue8m0=False,
          tokens=TOKENS):
    return SiluAndMulFP8QuantProblem(num_tokens=tokens, dtype=dtype, intermediate=intermediate,
                                     group_size=group, column_major_scales=column_major,
                                     ue8m0=ue8m0)


def _norm(hidden, fused_add=True, dtype="bfloat16", group=128, column_major=True, ue8m0=False,
          weight_bias=0.0, tokens=TOKENS):
    return RMSNormFP8QuantProblem(num_tokens=tokens, dtype=dtype, hidden=hidden, eps=1e-6,
                                  weight_bias=weight_bias, fused_add=fused_add, group_size=group,
                                  column_major_scales=column_major, ue8m0=ue8m0)


CASES = [
    (QUANT_KERNEL, _quant(7168)),                                   # DeepSeek-V3's hidden
    (QUANT_KERNEL, _quant(2048, ue8m0=True)),
    (QUANT_KERNEL, _quant(4096, "float16", 64, column_major=False)),
    (QUANT_KERNEL, _quant(192, "bfloat16", 64, column_major=False, ue8m0=True)),
    (SILU_QUANT_KERNEL, _silu(2048)),                               # DeepSeek-V3's experts
    (SILU_QUANT_KERNEL, _silu(1536, "float16", 64, column_major=False, ue8m0=True)),
    (NORM_KERNEL, _norm(7168)),                                     # ragged over 8 warps
    (NORM_KERNEL, _norm(512, fused_add=False)),                     # DeepSeek-V3's kv norm
    (NORM_KERNEL, _norm(1536, fused_add=False, ue8m0=True)),
    (NORM_KERNEL, _norm(2048, True, "float16", 64, False, True, weight_bias=1.0)),
]
IDS = [f"{kernel.name}-{problem.describe()}" for kernel, problem in CASES]


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("kernel, problem", CASES, ids=IDS)
def test_points_match_reference(kernel, problem, which):
    points = selected_points(which, kernel, problem, H200)
    assert points
    compile_all(kernel, problem, points)
    assert_every_point(points, lambda i, config: verify(
        kernel, problem, compiled(kernel, problem, config), CUDA, seed=i), problem.describe())


@pytest.mark.parametrize("kernel, problem", [
    (QUANT_KERNEL, _quant(7168, tokens=1)), (SILU_QUANT_KERNEL, _silu(2048, tokens=1)),
    (NORM_KERNEL, _norm(7168, tokens=1)), (NORM_KERNEL, _norm(512, False, tokens=1))],
    ids=["quant", "silu", "norm-fused", "norm-plain"])
@pytest.mark.parametrize("tokens", [1, 2, 37, 1000, 4097, 32768])
def test_token_count_is_dynamic(kernel, problem, tokens):
    """The default config of each bucket size, one compile serving every count."""
    config = kernel.default_config(problem.with_tokens(tokens), H200)
    verify(kernel, problem.with_tokens(tokens), compiled(kernel, problem, config), CUDA,
           seed=tokens)


def _with_non_finite(tensors, name: str) -> None:
    """NaN in one group of the first row, +inf in one group of the second, -inf and NaN
    together in a third row's group."""
    x = tensors[name]
    x[0, 3] = float("nan")
    x[1, 70] = float("inf")
    x[2, 5] = float("-inf")
    x[2, 9] = float("nan")


@pytest.mark.parametrize("kernel, problem, config", [
    (QUANT_KERNEL, _quant(512, tokens=4), GroupQuantConfig(128, 8, 2, 1)),
    (QUANT_KERNEL, _quant(512, group=64, column_major=False, ue8m0=True, tokens=4),
     GroupQuantConfig(32, 32, 1, 2, "streaming")),
    (SILU_QUANT_KERNEL, _silu(256, tokens=4), GroupQuantConfig(64, 4, 1, 1)),
    (NORM_KERNEL, _norm(512, False, tokens=4), RMSNormConfig(WARP_PER_ROW, 128, 1)),
    (NORM_KERNEL, _norm(1024, True, tokens=4), RMSNormConfig(BLOCK_PER_ROW, 64, 2)),
], ids=["quant", "quant-ue8m0-row", "silu", "norm-plain", "norm-fused"])
def test_nan_and_infinity_are_treated_as_the_reference_treats_them(kernel, problem, config):
    """A NaN is left out of its group's amax and quantises to NaN; an infinity makes the
    scale infinite, the group's finite values zero and itself NaN (fp8_quant.py). In the norm
    a non-finite element makes its row's RMS non-finite: the whole row's groups follow, as
    the reference's do."""
    tensors = kernel.make_inputs(problem, CUDA, torch.Generator(CUDA).manual_seed(0))
    _with_non_finite(tensors, "x")
    expected = kernel.reference(tensors, problem)
    kernel.launch(compiled(kernel, problem, config), tensors)
    torch.cuda.synchronize()
    if kernel is QUANT_KERNEL:
        check_exact(tensors, expected, ("q", "scales"))
    else:
        check_fused(tensors, expected, problem.dtype)
    assert expected["q"].isnan().any()


def test_padded_rows_are_read_and_written_in_place():
    problem = _quant(1024, ue8m0=True, tokens=TOKENS)
    g = torch.Generator(CUDA).manual_seed(0)
    x_buffer = torch.randn(TOKENS, 1024 + 64, device=CUDA, generator=g).bfloat16()
    q_buffer = torch.full((TOKENS, 1024 + 32), 1.0, device=CUDA).to(FP8_DTYPE)
    # Column-major scales padded to 40 tokens, as the op allocates them; the kernel's tensor
    # is their transpose.
    scales_buffer = torch.full((8, 40), 7.0, device=CUDA)
    tensors = {"x": x_buffer[:, :1024], "q": q_buffer[:, 16:1040],
               "scales": scales_buffer[:, :TOKENS]}
    expected = QUANT_KERNEL.reference(tensors, problem)

    def check(_, config):
        tensors["q"].fill_(float("nan"))
        QUANT_KERNEL.launch(compiled(QUANT_KERNEL, problem, config), tensors)
        torch.cuda.synchronize()
        check_exact(tensors, expected, ("q", "scales"))
        assert (q_buffer[:, :16].float() == 1).all() and (q_buffer[:, 1040:].float() == 1).all()
        # The scales' padding tokens (37 -> 40) are never written.
        assert (scales_buffer[:, TOKENS:] == 7.0).all()

    points = selected_points("covering", QUANT_KERNEL, problem, H200)
    compile_all(QUANT_KERNEL, problem, points)
    assert_every_point(points, check, "padded rows")


# ---------------------------------------------------------------------------------------------
# The public ops


def _x(tokens=5, width=1024, dtype=torch.bfloat16):
    g = torch.Generator(CUDA).manual_seed(tokens)
    return (4 * torch.randn(tokens, width, device=CUDA, generator=g)).to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    check_exact({"a": a}, {"a": b.float()}, ("a",))


@pytest.mark.parametrize("tokens", [1, 3, 300, 5000])
@pytest.mark.parametrize("column_major", [False, True])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_public_ops_equal_the_unfused_chains(tokens, column_major, ue8m0):
    quant = {"group_size": 128, "column_major_scales": column_major, "ue8m0": ue8m0}
    x = _x(tokens, 4096)
    q, scales = silu_and_mul_fp8_quant(x, **quant)
    chained = fp8_group_quant(silu_and_mul(x), **quant)
    torch.cuda.synchronize()
    assert q.dtype is FP8_DTYPE and q.shape == (tokens, 2048)
    assert (scales.stride()[0] == 1) == column_major or tokens == 1
    _same(q, chained[0])
    _same(scales, chained[1])
    # The quantisation itself against the CPU path (the reference).
    cpu_q, cpu_scales = fp8_group_quant(silu_and_mul(x).cpu(), **quant)
    _same(chained[0].cpu(), cpu_q.float())
    _same(chained[1].cpu(), cpu_scales)

    # The norm's sum of squares is reduced in the order of each kernel's config: the fused
    # kernel and rmsnorm may round a value one bf16 step apart (fp8_quant.check_fused).
    h, weight = _x(tokens, 7168), (1 + 0.5 * _x(1, 7168)[0].float()).bfloat16()
    q, scales = rmsnorm_fp8_quant(h, weight, 1e-6, 0.0, **quant)
    chained = fp8_group_quant(rmsnorm(h, weight, 1e-6), **quant)
    check_fused({"q": q, "scales": scales}, {"q": chained[0], "scales": chained[1]},
                "bfloat16")
    residual = _x(tokens + 1, 7168)[:tokens].contiguous()
    chained_residual = residual.clone()
    q, scales, returned = fused_add_rmsnorm_fp8_quant(h, residual, weight, 1e-6, 0.0, **quant)
    normed, _ = fused_add_rmsnorm(h, chained_residual, weight, 1e-6)
    chained = fp8_group_quant(normed, **quant)
    torch.cuda.synchronize()
    assert returned is residual
    assert torch.equal(residual, chained_residual)
    check_fused({"q": q, "scales": scales}, {"q": chained[0], "scales": chained[1]},
                "bfloat16")


def test_public_op_writes_given_buffers():
    x = _x(37)
    out = torch.empty(37, 1024, device=CUDA, dtype=FP8_DTYPE)
    scales = torch.empty(8, 64, device=CUDA).t()[:37]  # column-major, token stride 64
    q, s = fp8_group_quant(x, 128, column_major_scales=True, out=out, scales=scales)
    torch.cuda.synchronize()
    assert q is out and s is scales
    cpu_q, cpu_scales = fp8_group_quant(x.cpu(), 128)
    _same(out.cpu(), cpu_q.float())
    _same(scales.cpu(), cpu_scales)


@pytest.mark.parametrize(("bad", "error", "message"), [
    (lambda: {"out": torch.empty(37, 1024, device=CUDA)}, TypeError,
     "out has dtype torch.float32: it must be torch.float8_e4m3fn"),
    (lambda: {"out": torch.empty(38, 1024, device=CUDA, dtype=FP8_DTYPE)}, ValueError,
     "out must have shape (37, 1024), got (38, 1024)"),
    (lambda: {"scales": torch.empty(37, 8, device=CUDA, dtype=torch.float64)}, TypeError,
     "scales has dtype torch.float64: it must be torch.float32"),
    (lambda: {"scales": torch.empty(37, 16, device=CUDA)}, ValueError,
     "scales must have shape (37, 8) (tokens, width / group_size), got (37, 16)"),
], ids=["out-dtype", "out-shape", "scales-dtype", "scales-shape"])
def test_public_op_refuses_bad_buffers_after_a_good_call(bad, error, message):
    # The good calls make the route serve this key; a buffer of the wrong dtype or shape must
    # still meet the op's checks, not be written past its end.
    x = _x(37)
    for _ in range(2):
        fp8_group_quant(x, 128, out=torch.empty(37, 1024, device=CUDA, dtype=FP8_DTYPE),
                        scales=torch.empty(37, 8, device=CUDA))
    with pytest.raises(error, match=re.escape(message)):
        fp8_group_quant(x, 128, **bad())

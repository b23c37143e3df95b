"""The gated activations on the GPU: the covering points (every valid point under the `sweep`
marker) against the fp32 reference, dynamic token counts, padded rows, indices past 2^31, and the
public ops."""

from __future__ import annotations

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.device.verify import check_outputs, compare, verify
from cutetune.kernels import activation as act
from cutetune.kernels.activation import (
    GELU_KERNEL,
    SILU_KERNEL,
    ActivationConfig,
    GatedProblem,
    GeluAndMulProblem,
    SiluAndMulProblem,
)
from cutetune.kernels.dtypes import DTYPE_BYTES, DTYPE_NAMES, FLOAT_TOLERANCE, TORCH_DTYPES
from cutetune.ops.activation import gelu_and_mul, silu_and_mul
from testkit.compiled_points import compile_all, compiled
from testkit.covering_points import WHICH_POINTS, selected_points
from testkit.every_point import assert_every_point

pytestmark = pytest.mark.gpu

H200 = DEVICE_SPECS["H200"]
CUDA = torch.device("cuda")
# Ragged: 37 rows of every width below leave the last block partial and make blocks straddle
# rows, so the tail guard and the row/column split are both exercised.
TOKENS = 37


def _kernel(problem: GatedProblem):
    return GELU_KERNEL if isinstance(problem, GeluAndMulProblem) else SILU_KERNEL


def _silu(dtype: str, width: int, tokens: int = TOKENS) -> SiluAndMulProblem:
    return SiluAndMulProblem(num_tokens=tokens, dtype=dtype, intermediate=width)


def _gelu(dtype: str, width: int, form: str, tokens: int = TOKENS) -> GeluAndMulProblem:
    return GeluAndMulProblem(num_tokens=tokens, dtype=dtype, intermediate=width,
                             approximate=form)


PROBLEMS = [
    _silu("bfloat16", 768),      # Qwen3-30B-A3B's experts
    _silu("float16", 1000),
    _silu("float32", 1000),
    _silu("bfloat16", 1004),     # 64-bit vectors at most
    _silu("float16", 1002),      # 32-bit vectors only
    _gelu("bfloat16", 1536, "none"),
    _gelu("bfloat16", 1536, "tanh"),
    _gelu("float16", 1000, "none"),
    _gelu("float16", 1000, "tanh"),
    _gelu("float32", 1000, "none"),
    _gelu("float32", 1001, "tanh"),  # one fp32 element a vector
]


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.describe())
def test_points_match_reference(problem, which):
    kernel = _kernel(problem)
    points = selected_points(which, kernel, problem, H200)
    assert points
    compile_all(kernel, problem, points)
    assert_every_point(points, lambda i, config: verify(
        kernel, problem, compiled(kernel, problem, config), CUDA, seed=i), problem.describe())


@pytest.mark.parametrize("config", [ActivationConfig(128, 1, 1), ActivationConfig(128, 4, 8),
                                    ActivationConfig(128, 4, 8, "streaming")],
                         ids=["1x1warp", "4x8warps", "4x8warps-streaming"])
@pytest.mark.parametrize("tokens", [1, 2, 37, 1000, 4097])
def test_token_count_is_dynamic(config, tokens):
    problem = _silu("bfloat16", 14336, tokens=1)
    verify(SILU_KERNEL, problem.with_tokens(tokens), compiled(SILU_KERNEL, problem, config), CUDA,
           seed=tokens)


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("problem", [_silu("bfloat16", 768), _gelu("float32", 1000, "tanh"),
                                     _silu("float16", 1002)], ids=lambda p: p.describe())
def test_padded_rows_are_read_and_written_in_place(problem, which):
    """x as a view into a wider gate-up buffer and out into a wider output buffer, the way an
    engine's workspace may hand them over: the padding must stay untouched."""
    kernel = _kernel(problem)
    dtype = TORCH_DTYPES[problem.dtype]
    width, tokens = problem.intermediate, problem.num_tokens
    pad = 16 // DTYPE_BYTES[problem.dtype]  # one 16-byte vector of padding a row
    g = torch.Generator(CUDA).manual_seed(0)
    x_buffer = (2 * torch.randn(tokens, 2 * width + pad, device=CUDA, generator=g)).to(dtype)
    out_buffer = torch.full((tokens, width + 3 * pad), 7.0, device=CUDA, dtype=dtype)
    tensors = {"x": x_buffer[:, : 2 * width], "out": out_buffer[:, pad: pad + width]}
    expected = kernel.reference(tensors, problem)

    def check(_, config):
        tensors["out"].fill_(float("nan"))
        kernel.launch(compiled(kernel, problem, config), tensors)
        torch.cuda.synchronize()
        check_outputs(kernel, problem, tensors, expected)
        assert torch.all(out_buffer[:, :pad] == 7.0) and torch.all(
            out_buffer[:, pad + width:] == 7.0), "wrote into the row padding"

    points = selected_points(which, kernel, problem, H200)
    compile_all(kernel, problem, points)
    assert_every_point(points, check, f"{problem.describe()} with padded rows")


def test_vector_indices_past_2_to_the_31():
    """bf16 I=6 takes 32-bit vectors, 3 a row: 716M rows are 2^31 + vectors (26 GB in all).
    The block's first vector is split into row and column in 64 bits; a 32-bit flat index
    would wrap and write the wrong rows."""
    problem = _silu("bfloat16", 6, tokens=2**31 // 3 + 1000)
    config = ActivationConfig(32, 4, 8)
    SILU_KERNEL.space.check(problem, config, H200)
    x = torch.empty(problem.num_tokens, 12, device=CUDA, dtype=torch.bfloat16).uniform_(-4, 4)
    out = torch.full((problem.num_tokens, 6), float("nan"), device=CUDA, dtype=torch.bfloat16)
    SILU_KERNEL.launch(compiled(SILU_KERNEL, problem, config), {"x": x, "out": out})
    torch.cuda.synchronize()
    rtol, atol = FLOAT_TOLERANCE["bfloat16"]
    crossing = 2**31 // 3  # the row whose vectors straddle flat index 2^31
    for rows in (slice(0, 4096), slice(crossing - 4096, crossing + 4096),
                 slice(problem.num_tokens - 4096, None)):
        part = {"x": x[rows], "out": out[rows]}
        expected = act.reference(part, problem)["out"]
        compare(f"out[{rows.start}:{rows.stop}]", part["out"], expected, rtol, atol)
    assert not torch.isnan(out).any()


# ---------------------------------------------------------------------------------------------
# The public ops


def _x(tokens=5, width=768, dtype=torch.bfloat16, padded=False):
    g = torch.Generator(CUDA).manual_seed(tokens)
    extra = 16 // torch.tensor([], dtype=dtype).element_size() if padded else 0
    x = (2 * torch.randn(tokens, 2 * width + extra, device=CUDA, generator=g)).to(dtype)
    return x[:, : 2 * width]


def _expected(x: torch.Tensor, approximate: str | None) -> torch.Tensor:
    width = x.shape[1] // 2
    dtype = DTYPE_NAMES[x.dtype]
    if approximate is None:
        problem = _silu(dtype, width, tokens=max(1, x.shape[0]))
    else:
        problem = _gelu(dtype, width, approximate, tokens=max(1, x.shape[0]))
    return act.reference({"x": x}, problem)["out"]


OPS = [
    pytest.param(lambda x, out=None: silu_and_mul(x, out=out), None, id="silu"),
    pytest.param(lambda x, out=None: gelu_and_mul(x, out=out), "none", id="gelu-none"),
    pytest.param(lambda x, out=None: gelu_and_mul(x, "tanh", out=out), "tanh",
                 id="gelu-tanh"),
]


@pytest.mark.parametrize(("op", "approximate"), OPS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("padded", [False, True])
def test_public_op_matches_reference(op, approximate, dtype, padded):
    x = _x(dtype=dtype, padded=padded)
    rtol, atol = FLOAT_TOLERANCE[DTYPE_NAMES[dtype]]
    out = op(x)
    torch.cuda.synchronize()
    assert out.shape == (5, 768) and out.dtype is dtype and out.is_contiguous()
    compare("out", out, _expected(x, approximate), rtol, atol)
    given = torch.full_like(out, float("nan"))
    assert op(x, out=given) is given
    torch.cuda.synchronize()
    compare("out", given, _expected(x, approximate), rtol, atol)


@pytest.mark.parametrize(("op", "approximate"), OPS)
@pytest.mark.parametrize("tokens", [1, 3, 300, 5000])
def test_public_op_serves_every_token_count(op, approximate, tokens):
    x = _x(tokens=tokens, width=1536)
    out = op(x)
    torch.cuda.synchronize()
    compare("out", out, _expected(x, approximate), *FLOAT_TOLERANCE["bfloat16"])


def test_public_op_with_no_tokens_launches_nothing():
    x = _x(tokens=0)
    out = silu_and_mul(x)
    assert out.shape == (0, 768)
    given = torch.empty(0, 768, device=CUDA, dtype=torch.bfloat16)
    assert gelu_and_mul(x, "tanh", out=given) is given


def test_public_op_goes_through_the_dispatcher():
    from cutetune.serving.warmup import current_dispatcher

    silu_and_mul(_x(tokens=7, width=2048))
    calls = current_dispatcher().default_calls()
    assert calls[("silu_and_mul", ("bfloat16", 2048), 8)] >= 1


def test_public_op_captures_into_a_cuda_graph():
    x = _x(tokens=64)
    out = torch.empty(64, 768, device=CUDA, dtype=torch.bfloat16)
    silu_and_mul(x, out=out)  # compile outside the capture
    out.fill_(float("nan"))
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        silu_and_mul(x, out=out)
    graph.replay()
    torch.cuda.synchronize()
    compare("out", out, _expected(x, None), *FLOAT_TOLERANCE["bfloat16"])


def test_public_op_rejects_an_output_on_another_device():
    x = _x()
    with pytest.raises(ValueError, match="out is on cpu but x is on cuda"):
        silu_and_mul(x, out=torch.empty(5, 768, dtype=torch.bfloat16))

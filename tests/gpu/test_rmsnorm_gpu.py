"""RMSNorm on the GPU: the covering points (every valid point under the `sweep` marker) against the
fp32 reference (ragged row counts, strided
rows, fused add, output dtypes, weight bias), the public ops, CUDA graphs."""

from __future__ import annotations

import re

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.device.verify import check_outputs, compare, verify
from cutetune.kernels import rmsnorm as rn
from cutetune.kernels.dtypes import DTYPE_NAMES, FLOAT_TOLERANCE
from cutetune.ops.rmsnorm import fused_add_rmsnorm, rmsnorm
from testkit.compiled_points import compile_all, compiled
from testkit.covering_points import WHICH_POINTS, covering_configs, selected_points
from testkit.every_point import assert_every_point

pytestmark = pytest.mark.gpu

H200 = DEVICE_SPECS["H200"]
CUDA = torch.device("cuda")
# Odd row count: warp_per_row's last block is partial, so its tail guard is exercised.
ROWS = 37


def _problem(dtype="bfloat16", out_dtype=None, hidden=4096, fused_add=False, weight_bias=0.0,
             rows=ROWS, eps=1e-6):
    return rn.RMSNormProblem(num_tokens=rows, dtype=dtype, out_dtype=out_dtype or dtype,
                             hidden=hidden, eps=eps, weight_bias=weight_bias,
                             fused_add=fused_add)


PROBLEMS = [
    # dtype, out_dtype, hidden, fused_add, weight_bias
    ("bfloat16", "bfloat16", 4096, False, 0.0),
    ("bfloat16", "bfloat16", 2880, True, 0.0),  # the last vector slot predicated
    ("float16", "float16", 1024, True, 1.0),  # warp_per_row and block_per_row both valid
    ("float32", "float32", 5376, False, 1.0),
    ("bfloat16", "float32", 7168, True, 0.0),  # 64-bit loads, 128-bit stores
    ("float32", "bfloat16", 512, False, 0.0),  # 128-bit loads, 64-bit stores
    ("bfloat16", "bfloat16", 256, False, 1.0),
    ("bfloat16", "bfloat16", 16384, True, 0.0),
    ("float16", "float16", 2882, False, 0.0),  # only 32-bit vectors divide it
]


@pytest.mark.parametrize(("dtype", "out_dtype", "hidden", "fused_add", "weight_bias"), PROBLEMS,
                         ids=[f"{d}-{o}-{h}-{'fused' if f else 'plain'}-bias{b:g}"
                              for d, o, h, f, b in PROBLEMS])
@pytest.mark.parametrize("which", WHICH_POINTS)
def test_points_match_reference(dtype, out_dtype, hidden, fused_add, weight_bias, which):
    problem = _problem(dtype, out_dtype, hidden, fused_add, weight_bias)
    points = _points(which, problem)
    assert_every_point(points, lambda i, config: verify(
        rn.KERNEL, problem, compiled(rn.KERNEL, problem, config), CUDA, seed=i),
        problem.describe())


def _points(which: str, problem: rn.RMSNormProblem) -> list[rn.RMSNormConfig]:
    points = selected_points(which, rn.KERNEL, problem, H200)
    assert points
    compile_all(rn.KERNEL, problem, points)
    return points


@pytest.mark.parametrize(("hidden", "fused_add"), [(1024, False), (4096, True), (2880, True)])
@pytest.mark.parametrize("rows", [1, 2, 1000, 4097])
def test_row_count_is_dynamic(hidden, fused_add, rows):
    problem = _problem(hidden=hidden, fused_add=fused_add, rows=1)
    for config in {rn.default_config(problem, H200),
                   rn.default_config(problem.with_tokens(4096), H200)}:
        verify(rn.KERNEL, problem.with_tokens(rows), compiled(rn.KERNEL, problem, config), CUDA,
               seed=rows)


def _strided_inputs(problem: rn.RMSNormProblem, generator: torch.Generator):
    """x, residual and out as column slices of wider buffers (row strides larger than hidden,
    each by a different multiple of 16 bytes), with the pads filled by a sentinel."""
    tensors = rn.make_inputs(problem, CUDA, generator)
    views, buffers = {}, {}
    for pad_vectors, name in ((1, "x"), (3, "residual"), (2, "out")):
        t = tensors[name]
        pad = pad_vectors * 16 // t.element_size()
        buffer = torch.full((t.shape[0], t.shape[1] + pad), 7.0, dtype=t.dtype, device=CUDA)
        buffer[:, : t.shape[1]] = t
        buffers[name] = buffer
        views[name] = buffer[:, : t.shape[1]]
    views["weight"] = tensors["weight"]
    return views, buffers


@pytest.mark.parametrize(("dtype", "out_dtype", "hidden", "fused_add"), [
    ("bfloat16", "bfloat16", 2880, True),
    ("float32", "bfloat16", 1024, False),
    ("bfloat16", "float32", 4096, True),
])
@pytest.mark.parametrize("which", WHICH_POINTS)
def test_points_handle_strided_rows(dtype, out_dtype, hidden, fused_add, which):
    problem = _problem(dtype, out_dtype, hidden, fused_add)

    def check(i, config):
        generator = torch.Generator(CUDA).manual_seed(i)
        tensors, buffers = _strided_inputs(problem, generator)
        expected = rn.reference(tensors, problem)
        tensors["out"].fill_(float("nan"))
        rn.KERNEL.launch(compiled(rn.KERNEL, problem, config), tensors)
        torch.cuda.synchronize()
        check_outputs(rn.KERNEL, problem, tensors, expected)
        for name, buffer in buffers.items():
            assert torch.all(buffer[:, hidden:] == 7.0), f"wrote into the row padding of {name}"

    assert_every_point(_points(which, problem), check, f"{problem.describe()} with strided rows")


def test_plain_form_leaves_the_residual_alone():
    problem = _problem(hidden=2880)
    tensors = rn.make_inputs(problem, CUDA, torch.Generator(CUDA).manual_seed(0))
    before = tensors["residual"].clone()
    points = covering_configs(rn.KERNEL, problem, H200)
    compile_all(rn.KERNEL, problem, points)
    for config in points:
        rn.KERNEL.launch(compiled(rn.KERNEL, problem, config), tensors)
    torch.cuda.synchronize()
    assert torch.equal(tensors["residual"], before)


# ---------------------------------------------------------------------------------------------
# The public ops


def _inputs(rows=5, hidden=4096, dtype=torch.bfloat16, seed=0):
    g = torch.Generator("cuda").manual_seed(seed)
    x = torch.randn(rows, hidden, device="cuda", generator=g).to(dtype)
    residual = torch.randn(rows, hidden, device="cuda", generator=g).to(dtype)
    w = (1 + 0.5 * torch.randn(hidden, device="cuda", generator=g)).to(dtype)
    return x, residual, w


def _expect(problem, x, residual, w):
    tensors = {"x": x, "residual": residual if residual is not None else x, "weight": w}
    return rn.reference(tensors, problem)


def _compare(name, actual, expected):
    rtol, atol = FLOAT_TOLERANCE[DTYPE_NAMES[actual.dtype]]
    compare(name, actual, expected, rtol, atol)


@pytest.mark.parametrize("out_dtype", [None, torch.float32])
@pytest.mark.parametrize("weight_bias", [0.0, 1.0])
@pytest.mark.parametrize(("rows", "hidden"), [(1, 4096), (300, 2880), (5, 512)])
def test_public_rmsnorm_matches_reference(out_dtype, weight_bias, rows, hidden):
    x, _, w = _inputs(rows, hidden)
    problem = _problem(out_dtype=DTYPE_NAMES[out_dtype or x.dtype], hidden=hidden,
                       weight_bias=weight_bias, rows=rows, eps=1e-5)
    expected = _expect(problem, x, None, w)
    out = rmsnorm(x, w, eps=1e-5, weight_bias=weight_bias, out_dtype=out_dtype)
    torch.cuda.synchronize()
    assert out.dtype == (out_dtype or x.dtype) and out.shape == x.shape
    _compare("out", out, expected["out"])


@pytest.mark.parametrize("out_dtype", [None, torch.float32])
@pytest.mark.parametrize(("rows", "hidden"), [(1, 7168), (300, 2880), (64, 1536)])
def test_public_fused_add_rmsnorm_matches_reference(out_dtype, rows, hidden):
    x, residual, w = _inputs(rows, hidden)
    problem = _problem(out_dtype=DTYPE_NAMES[out_dtype or x.dtype], hidden=hidden,
                       fused_add=True, rows=rows)
    expected = _expect(problem, x, residual, w)
    x_before = x.clone()
    out, returned = fused_add_rmsnorm(x, residual, w, out_dtype=out_dtype)
    torch.cuda.synchronize()
    assert returned is residual  # updated in place, as vLLM's fused_add_rms_norm
    _compare("residual", residual, expected["residual"])
    _compare("out", out, expected["out"])
    assert torch.equal(x, x_before)


def test_public_ops_write_in_place_into_x():
    # vLLM's convention: the normalised output overwrites the input.
    x, residual, w = _inputs(rows=33, hidden=2048)
    problem = _problem(hidden=2048, fused_add=True, rows=33)
    expected = _expect(problem, x, residual, w)
    out, _ = fused_add_rmsnorm(x, residual, w, out=x)
    torch.cuda.synchronize()
    assert out is x
    _compare("out", x, expected["out"])
    _compare("residual", residual, expected["residual"])
    x, _, w = _inputs(rows=33, hidden=2048, seed=1)
    expected = _expect(_problem(hidden=2048, rows=33), x, None, w)
    assert rmsnorm(x, w, out=x) is x
    torch.cuda.synchronize()
    _compare("out", x, expected["out"])


def test_public_ops_take_strided_rows():
    # x and the residual as column blocks of one (9, 4 * 4096) buffer, like slices of a
    # fused projection's output; the blocks between and after them must stay as they were.
    buffer = torch.randn(9, 4 * 4096, device="cuda").bfloat16()
    x, residual = buffer[:, :4096], buffer[:, 8192:12288]
    _, _, w = _inputs(hidden=4096)
    problem = _problem(fused_add=True, rows=9)
    expected = _expect(problem, x, residual, w)
    others = buffer[:, 4096:8192].clone(), buffer[:, 12288:].clone()
    out, _ = fused_add_rmsnorm(x, residual, w)
    torch.cuda.synchronize()
    _compare("out", out, expected["out"])
    _compare("residual", residual, expected["residual"])
    assert torch.equal(buffer[:, 4096:8192], others[0])
    assert torch.equal(buffer[:, 12288:], others[1])


def test_zero_rows_return_at_once():
    x, residual, w = _inputs(rows=0)
    assert rmsnorm(x, w).shape == (0, 4096)
    out, returned = fused_add_rmsnorm(x, residual, w, out_dtype=torch.float32)
    assert out.shape == (0, 4096) and out.dtype == torch.float32 and returned is residual


def test_public_op_captures_into_a_cuda_graph():
    x, residual, w = _inputs(rows=64)
    problem = _problem(fused_add=True, rows=64)
    fused_add_rmsnorm(x.clone(), residual.clone(), w)  # compile outside the capture
    expected = _expect(problem, x, residual, w)
    out = torch.empty_like(x)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        fused_add_rmsnorm(x, residual, w, out=out)
    graph.replay()
    torch.cuda.synchronize()
    _compare("out", out, expected["out"])
    _compare("residual", residual, expected["residual"])


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda x, r, w: (x, r, w.cpu()), "weight is on cpu but x is on cuda:0"),
    (lambda x, r, w: (x, r.cpu(), w), "residual is on cpu but x is on cuda:0"),
    (lambda x, r, w: (x.cpu(), r, w), "residual is on cuda:0 but x is on cpu"),
    (lambda x, r, w: (x, r, w.half()), "must match"),
    (lambda x, r, w: (x[:, 1:2001], r[:, 1:2001], w[:2000]), "aligned to 8 elements"),
])
def test_public_op_rejects_bad_input(mutate, message):
    args = mutate(*_inputs())
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        fused_add_rmsnorm(*args)


# ---------------------------------------------------------------------------------------------
# Peers (run where their libraries are installed): same outputs as the reference


@pytest.mark.parametrize("fused_add", [False, True])
def test_peers_match_the_reference_where_available(fused_add):
    problem = _problem(hidden=4096, fused_add=fused_add, rows=64)
    ran = 0
    for peer in rn.KERNEL.peers:
        try:
            run = peer.build(problem)
        except rn.PeerUnavailable:
            continue
        tensors = rn.make_inputs(problem, CUDA, torch.Generator(CUDA).manual_seed(3))
        expected = rn.reference(tensors, problem)
        outputs = run(tensors)
        torch.cuda.synchronize()
        for name in rn.KERNEL.outputs:
            rtol, atol = FLOAT_TOLERANCE[DTYPE_NAMES[outputs[name].dtype]]
            compare(f"{peer.name} {name}", outputs[name], expected[name], rtol, atol)
        ran += 1
    if not ran:
        pytest.skip("no peer library installed")

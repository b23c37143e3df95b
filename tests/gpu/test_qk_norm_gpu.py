"""QK-norm on the GPU: the covering points (every valid point under the `sweep` marker) against
the fp32 reference, the public op, graphs."""

from __future__ import annotations

import re

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.device.verify import check_outputs, verify
from cutetune.kernels import qk_norm as qk
from cutetune.kernels.dtypes import TORCH_DTYPES
from testkit.compiled_points import compile_all, compiled
from testkit.covering_points import WHICH_POINTS, selected_points
from testkit.every_point import assert_every_point

pytestmark = pytest.mark.gpu

H200 = DEVICE_SPECS["H200"]
# Odd token count: the last block of q and of k is partial, so the tail guard is exercised.
TOKENS = 37


def _problem(dtype: str, head_dim: int, weight_bias: float = 0.0, tokens: int = TOKENS):
    return qk.QKNormProblem(num_tokens=tokens, dtype=dtype, head_dim=head_dim, q_heads=6,
                            kv_heads=2, eps=1e-6, weight_bias=weight_bias)


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("head_dim", qk.HEAD_DIMS)
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_points_match_reference(dtype, head_dim, which):
    problem = _problem(dtype, head_dim, weight_bias=1.0 if head_dim == 128 else 0.0)
    points = selected_points(which, qk.KERNEL, problem, H200)
    assert points
    compile_all(qk.KERNEL, problem, points)
    assert_every_point(points, lambda i, config: verify(
        qk.KERNEL, problem, compiled(qk.KERNEL, problem, config), torch.device("cuda"), seed=i),
        problem.describe())


@pytest.mark.parametrize("tokens", [1, 2, 1000, 4097])
def test_token_count_is_dynamic(tokens):
    problem = _problem("bfloat16", 128)
    default = compiled(qk.KERNEL, problem, qk.default_config(problem, H200))
    verify(qk.KERNEL, problem.with_tokens(tokens), default, torch.device("cuda"), seed=tokens)


def _inputs(tokens=5, q_heads=4, kv_heads=2, d=128, dtype=torch.bfloat16, contiguous=False):
    g = torch.Generator("cuda").manual_seed(0)
    if contiguous:
        q = torch.randn(tokens, q_heads, d, device="cuda", generator=g).to(dtype)
        k = torch.randn(tokens, kv_heads, d, device="cuda", generator=g).to(dtype)
    else:  # views into a fused qkv projection output
        qkv = torch.randn(tokens, q_heads + 2 * kv_heads, d, device="cuda", generator=g).to(dtype)
        q, k = qkv[:, :q_heads], qkv[:, q_heads:q_heads + kv_heads]
    w = (1 + 0.5 * torch.randn(2, d, device="cuda", generator=g)).to(dtype)
    return q, k, w[0], w[1]


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("weight_bias", [0.0, 1.0])
def test_public_op_matches_reference(contiguous, weight_bias):
    import cutetune

    q, k, qw, kw = _inputs(contiguous=contiguous)
    tensors = {"q": q, "k": k, "q_weight": qw, "k_weight": kw}
    problem = qk.QKNormProblem(num_tokens=5, dtype="bfloat16", head_dim=128, q_heads=4,
                               kv_heads=2, eps=1e-5, weight_bias=weight_bias)
    expected = qk.reference(tensors, problem)
    cutetune.qk_norm(q, k, qw, kw, eps=1e-5, weight_bias=weight_bias)
    torch.cuda.synchronize()
    check_outputs(qk.KERNEL, problem, tensors, expected)


def test_public_op_leaves_the_rest_of_qkv_alone():
    import cutetune

    q, k, qw, kw = _inputs()
    qkv = q._base
    v_before = qkv[:, 6:].clone()
    cutetune.qk_norm(q, k, qw, kw)
    torch.cuda.synchronize()
    assert torch.equal(qkv[:, 6:], v_before)


def test_public_op_captures_into_a_cuda_graph():
    import cutetune

    q, k, qw, kw = _inputs(tokens=64)
    tensors = {"q": q, "k": k, "q_weight": qw, "k_weight": kw}
    problem = qk.QKNormProblem(num_tokens=64, dtype="bfloat16", head_dim=128, q_heads=4,
                               kv_heads=2, eps=1e-6, weight_bias=0.0)
    cutetune.qk_norm(q.clone(), k.clone(), qw, kw)  # compile outside the capture
    expected = qk.reference(tensors, problem)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        cutetune.qk_norm(q, k, qw, kw)
    graph.replay()
    torch.cuda.synchronize()
    check_outputs(qk.KERNEL, problem, tensors, expected)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda q, k, qw, kw: (q.float(), k, qw, kw), "dtype"),
    (lambda q, k, qw, kw: (q, k.half(), qw, kw), "must match"),
    (lambda q, k, qw, kw: (q[:, :, :64], k, qw, kw), "head_dim"),
    (lambda q, k, qw, kw: (q.transpose(1, 2).contiguous().transpose(1, 2), k, qw, kw),
     "contiguous"),
    (lambda q, k, qw, kw: (q, k[:3], qw, kw), "tokens"),
    (lambda q, k, qw, kw: (q, k, qw[:64], kw), "vector"),
    (lambda q, k, qw, kw: (q.cpu(), k, qw, kw), "k is on cuda:0 but q is on cpu"),
    (lambda q, k, qw, kw: (q[0], k, qw, kw), "(tokens, heads, head_dim)"),
])
def test_public_op_rejects_bad_input(mutate, message):
    import cutetune

    args = mutate(*_inputs(contiguous=True))
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        cutetune.qk_norm(*args)

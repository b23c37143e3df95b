"""QK-norm fused with RoPE on the GPU: every code path's covering points (every valid point
under the `sweep` marker) against the reference (qk_norm's, then rope's) on q and k views of a
fused qkv buffer, the public op against the reference and against the unfused ops, graphs and
the route's refusals."""

from __future__ import annotations

import re

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.device.verify import check_outputs, verify
from cutetune.kernels import qk_norm_rope, rope
from testkit.compiled_points import compile_all, compiled
from testkit.covering_points import WHICH_POINTS, selected_points
from testkit.every_point import assert_every_point

pytestmark = pytest.mark.gpu

H200 = DEVICE_SPECS["H200"]
KERNEL = qk_norm_rope.KERNEL
# Odd token count: the last block is partial, so the tail guard is exercised.
TOKENS = 37

# Llama 3.1's scaling.
LLAMA3 = dict(scaling=rope.LLAMA3, scaling_factor=8.0, low_freq_factor=1.0,
              high_freq_factor=4.0, original_max_position=8192)
# Gemma 3 4B to 27B's full-attention layers: every frequency divided by 8.
LINEAR = dict(scaling=rope.LINEAR, scaling_factor=8.0)


def _problem(dtype="bfloat16", head_dim=128, rotary_dim=128, style=rope.NEOX,
             positions="int64", cache=None, q_heads=6, kv_heads=2, theta=1e6, weight_bias=0.0,
             tokens=TOKENS, scaling=None) -> qk_norm_rope.QKNormRopeProblem:
    return qk_norm_rope.QKNormRopeProblem(
        num_tokens=tokens, dtype=dtype, head_dim=head_dim, rotary_dim=rotary_dim,
        q_heads=q_heads, kv_heads=kv_heads, style=style, positions_dtype=positions,
        cache_dtype=cache or dtype, theta=theta, eps=1e-6, weight_bias=weight_bias,
        **(scaling or {}))


# Every code path: Qwen3's and Qwen3-MoE's heads, Qwen3-Next's quarter rotary and zero-centred
# weights, Gemma 3's head dim 256, each style, int32 and int64 positions, a cache of q's dtype
# and of fp32, each dtype, Llama 3's and linear scalings (Gemma 3 27B's full-attention layers:
# 32 q heads of 128, 16 kv heads, zero-centred weights); covering_points adds both cos/sin
# sources.
PATHS = [
    pytest.param(_problem(), id="qwen3-bf16-neox-int64"),
    pytest.param(_problem(head_dim=256, rotary_dim=64, cache="float32", q_heads=16,
                          kv_heads=2, theta=1e7, weight_bias=1.0), id="qwen3-next-quarter"),
    pytest.param(_problem(dtype="float16", head_dim=256, rotary_dim=256, q_heads=4,
                          kv_heads=1, positions="int32", weight_bias=1.0), id="gemma-3-fp16"),
    pytest.param(_problem(rotary_dim=64, style=rope.GPTJ, positions="int32", cache="float32"),
                 id="bf16-gptj-partial-int32-fp32cache"),
    pytest.param(_problem(dtype="float32", head_dim=64, rotary_dim=64, style=rope.GPTJ,
                          theta=1e4), id="fp32-gptj-d64"),
    pytest.param(_problem(dtype="float32", rotary_dim=32, positions="int32"),
                 id="fp32-neox-narrow-int32"),
    pytest.param(_problem(theta=5e5, scaling=LLAMA3), id="bf16-neox-llama3"),
    pytest.param(_problem(q_heads=32, kv_heads=16, weight_bias=1.0, scaling=LINEAR),
                 id="gemma-3-27b-linear"),
]


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("problem", PATHS)
def test_points_match_reference(problem, which):
    points = selected_points(which, KERNEL, problem, H200)
    assert {p.cos_sin for p in points} == {rope.CACHE, rope.COMPUTED}
    compile_all(KERNEL, problem, points)
    assert_every_point(points, lambda i, config: verify(
        KERNEL, problem, compiled(KERNEL, problem, config), torch.device("cuda"), seed=i),
        problem.describe())


@pytest.mark.parametrize("tokens", [1, 2, 1000, 4097])
def test_token_count_is_dynamic(tokens):
    problem = _problem()
    default = compiled(KERNEL, problem, qk_norm_rope.default_config(problem, H200))
    verify(KERNEL, problem.with_tokens(tokens), default, torch.device("cuda"), seed=tokens)


def _inputs(tokens=5, q_heads=4, kv_heads=2, d=128, rotary_dim=128, dtype=torch.bfloat16,
            positions_dtype=torch.int64, theta=1e6, llama3=None, linear=None):
    """positions, q and k as views of a fused qkv buffer, the weights, and the cos_sin_cache of
    every position up to 8192 (float64 angles, rounded once to q's dtype)."""
    g = torch.Generator("cuda").manual_seed(0)
    qkv = torch.randn(tokens, q_heads + 2 * kv_heads, d, device="cuda", generator=g).to(dtype)
    positions = torch.randint(0, 8192, (tokens,), device="cuda", generator=g,
                              dtype=positions_dtype)
    weights = (1 + 0.5 * torch.randn(2, d, device="cuda", generator=g)).to(dtype)
    cache = rope.cos_sin_table(torch.arange(8192, device="cuda"), rotary_dim, theta,
                               llama3, linear=linear).to(dtype)
    return (positions, qkv[:, :q_heads], qkv[:, q_heads:q_heads + kv_heads], weights[0],
            weights[1], cache)


def _tensors(positions, q, k, q_weight, k_weight, cache) -> dict:
    return {"positions": positions, "q": q, "k": k, "q_weight": q_weight,
            "k_weight": k_weight, "cos_sin_cache": cache}


@pytest.mark.parametrize("scaling", [None, LLAMA3, LINEAR], ids=["theta", "llama3", "linear"])
@pytest.mark.parametrize(("is_neox", "rotary_dim", "weight_bias"),
                         [(True, 128, 0.0), (True, 64, 1.0), (False, 64, 0.0)])
def test_public_op_matches_reference_and_the_unfused_ops(is_neox, rotary_dim, weight_bias,
                                                         scaling):
    import cutetune

    problem = _problem(rotary_dim=rotary_dim, style=rope.NEOX if is_neox else rope.GPTJ,
                       positions="int32", q_heads=4, tokens=5, weight_bias=weight_bias,
                       scaling=scaling)
    inputs = _inputs(rotary_dim=rotary_dim, positions_dtype=torch.int32,
                     llama3=problem.llama3, linear=problem.linear)
    positions, q, k, q_weight, k_weight, cache = inputs
    qkv = q._base
    v_before = qkv[:, 6:].clone()
    tensors = _tensors(*inputs)
    expected = qk_norm_rope.reference(tensors, problem)
    unfused_q, unfused_k = q.clone(), k.clone()
    cutetune.qk_norm(unfused_q, unfused_k, q_weight, k_weight, 1e-6, weight_bias)
    cutetune.rope(positions, unfused_q, unfused_k, cache, 1e6, is_neox, **(scaling or {}))
    cutetune.qk_norm_rope(positions, q, k, q_weight, k_weight, cache, 1e6, 1e-6, weight_bias,
                          is_neox, **(scaling or {}))
    torch.cuda.synchronize()
    check_outputs(KERNEL, problem, tensors, expected)
    assert torch.equal(qkv[:, 6:], v_before)
    # The unfused path rounds to bf16 between the two launches: within a rounding.
    torch.testing.assert_close(q, unfused_q, rtol=1.6e-2, atol=2e-2)
    torch.testing.assert_close(k, unfused_k, rtol=1.6e-2, atol=2e-2)


def test_public_op_captures_into_a_cuda_graph():
    import cutetune

    inputs = _inputs(tokens=64)
    positions, q, k, q_weight, k_weight, cache = inputs
    tensors = _tensors(*inputs)
    problem = _problem(q_heads=4, tokens=64)
    # Compile outside the capture.
    cutetune.qk_norm_rope(positions, q.clone(), k.clone(), q_weight, k_weight, cache, 1e6)
    expected = qk_norm_rope.reference(tensors, problem)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        cutetune.qk_norm_rope(positions, q, k, q_weight, k_weight, cache, 1e6)
    graph.replay()
    torch.cuda.synchronize()
    check_outputs(KERNEL, problem, tensors, expected)


def _replace(index, value):
    return lambda inputs: tuple(value(t) if i == index else t for i, t in enumerate(inputs))


@pytest.mark.parametrize(("mutate", "message"), [
    (_replace(0, lambda p: p[:3]), "positions must be (5,), one per token of q"),
    (_replace(0, lambda p: p.float()), "positions has dtype torch.float32"),
    (_replace(3, lambda w: w.float()), "q_weight has dtype torch.float32"),
    (_replace(4, lambda w: w[:64]), "q_weight and k_weight must be contiguous (128,) vectors"),
    (_replace(5, lambda c: torch.cat((c, c), 1)), "rotary_dim (cos_sin_cache's width)"),
    (_replace(2, lambda k: k.half()), "k has dtype torch.float16"),
])
def test_public_op_rejects_bad_input_after_a_good_call(mutate, message):
    # The good call makes the route serve this key; the bad one must still meet the op's
    # checks (the compiled kernel refuses it before any launch, then the checked path names
    # the argument), not read past the end of positions or of a weight.
    import cutetune

    cutetune.qk_norm_rope(*_inputs(), 1e6)
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        cutetune.qk_norm_rope(*mutate(_inputs()), 1e6)

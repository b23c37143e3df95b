"""qk_norm_rope with the paged KV cache write on the GPU: each cache's covering points (every
valid point under the `sweep` marker) against the reference (qk_norm_rope's, then the cache
writes in torch) on q, k and v views of a fused qkv buffer, slots of -1 and unused slots left as
they were; the public op against qk_norm_rope followed by vLLM's reshape_and_cache_flash in
torch, graphs and the route's refusals."""

from __future__ import annotations

import re

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.device.verify import check_outputs, verify
from cutetune.kernels import qk_norm_rope_kv, rope
from cutetune.kernels.qk_norm_rope_kv import FP8
from testkit.compiled_points import compile_all, compiled
from testkit.covering_points import WHICH_POINTS, selected_points
from testkit.every_point import assert_every_point

pytestmark = pytest.mark.gpu

H200 = DEVICE_SPECS["H200"]
KERNEL = qk_norm_rope_kv.KERNEL
# Odd token count: the last block is partial, so the tail guard is exercised.
TOKENS = 37


def _problem(dtype="bfloat16", head_dim=128, rotary_dim=128, style=rope.NEOX, cache=None,
             q_heads=6, kv_heads=2, weight_bias=0.0, kv_cache=None, block_size=16,
             tokens=TOKENS) -> qk_norm_rope_kv.QKNormRopeKVProblem:
    return qk_norm_rope_kv.QKNormRopeKVProblem(
        num_tokens=tokens, dtype=dtype, head_dim=head_dim, rotary_dim=rotary_dim,
        q_heads=q_heads, kv_heads=kv_heads, style=style, positions_dtype="int64",
        cache_dtype=cache or dtype, theta=1e6, eps=1e-6, weight_bias=weight_bias,
        kv_cache_dtype=kv_cache or dtype, block_size=block_size)


# Each cache (q's dtype, FP8) under Qwen3's heads, Qwen3-Next's quarter rotary with 32-bit
# vectors possible, Gemma 3's fp16 head dim 256, GPT-J style, fp32 q and k, a block of 1 slot.
PATHS = [
    pytest.param(_problem(), id="qwen3-bf16-cache"),
    pytest.param(_problem(kv_cache=FP8), id="qwen3-fp8-cache"),
    pytest.param(_problem(head_dim=256, rotary_dim=64, cache="float32", q_heads=16,
                          weight_bias=1.0, kv_cache=FP8, block_size=32), id="qwen3-next-fp8"),
    pytest.param(_problem(dtype="float16", head_dim=256, q_heads=4, kv_heads=1,
                          weight_bias=1.0, kv_cache=FP8), id="gemma-3-fp16-fp8"),
    pytest.param(_problem(rotary_dim=64, style=rope.GPTJ, block_size=1), id="gptj-block-1"),
    pytest.param(_problem(dtype="float32", head_dim=64, rotary_dim=64, kv_cache=FP8),
                 id="fp32-d64-fp8"),
]


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("problem", PATHS)
def test_points_match_reference(problem, which):
    points = selected_points(which, KERNEL, problem, H200)
    compile_all(KERNEL, problem, points)
    assert_every_point(points, lambda i, config: verify(
        KERNEL, problem, compiled(KERNEL, problem, config), torch.device("cuda"), seed=i),
        problem.describe())


@pytest.mark.parametrize("kv_cache", ["bfloat16", FP8])
@pytest.mark.parametrize("tokens", [1, 2, 1000, 4097])
def test_token_count_is_dynamic(tokens, kv_cache):
    problem = _problem(kv_cache=kv_cache)
    default = compiled(KERNEL, problem, KERNEL.default_config(problem, H200))
    verify(KERNEL, problem.with_tokens(tokens), default, torch.device("cuda"), seed=tokens)


def _inputs(cache_dtype=torch.bfloat16, tokens=5, q_heads=4, kv_heads=2, d=128, block=16):
    """positions, q, k and v as views of a fused qkv buffer, the weights, the cos_sin_cache,
    slots with padding, caches of garbage laid out as vLLM's (2, num_blocks, ...) buffer, and
    the scales."""
    g = torch.Generator("cuda").manual_seed(0)
    qkv = torch.randn(tokens, q_heads + 2 * kv_heads, d, device="cuda", generator=g).bfloat16()
    positions = torch.randint(0, 8192, (tokens,), device="cuda", generator=g)
    weights = (1 + 0.5 * torch.randn(2, d, device="cuda", generator=g)).bfloat16()
    cache = rope.cos_sin_table(torch.arange(8192, device="cuda"), d, 1e6).bfloat16()
    blocks = tokens // block + 2
    slots = torch.randperm(blocks * block, device="cuda", generator=g)[:tokens]
    slots[::3] = -1
    caches = torch.full((2, blocks, block, kv_heads, d), 96.0, device="cuda").to(cache_dtype)
    return (positions, qkv[:, :q_heads], qkv[:, q_heads:q_heads + kv_heads],
            qkv[:, q_heads + kv_heads:], weights[0], weights[1], cache, slots, caches[0],
            caches[1], torch.tensor([0.125], device="cuda"),
            torch.tensor([0.03125], device="cuda"))


NAMES = ("positions", "q", "k", "v", "q_weight", "k_weight", "cos_sin_cache", "slot_mapping",
         "key_cache", "value_cache", "k_scale", "v_scale")


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_public_op_matches_reference_and_the_unfused_path(cache_dtype):
    import cutetune

    inputs = _inputs(cache_dtype)
    tensors = dict(zip(NAMES, inputs, strict=True))
    problem = _problem(q_heads=4, tokens=5, kv_cache="bfloat16" if cache_dtype ==
                       torch.bfloat16 else FP8)
    expected = KERNEL.reference(tensors, problem)
    positions, q, k, v, q_weight, k_weight, cache, slots = inputs[:8]
    two_q, two_k = q.clone(), k.clone()
    before = {name: tensors[name].clone() for name in ("key_cache", "value_cache")}
    cutetune.qk_norm_rope_kv(*inputs, 1e6)
    cutetune.qk_norm_rope(positions, two_q, two_k, q_weight, k_weight, cache, 1e6)
    torch.cuda.synchronize()
    check_outputs(KERNEL, problem, tensors, expected)
    # The unfused path: qk_norm_rope (within a rounding: its point may differ), then vLLM's
    # reshape_and_cache_flash in torch of the k this op left, which the caches hold bit for
    # bit: k and v divided by the scales and rounded to FP8 as vLLM does.
    torch.testing.assert_close(q, two_q, rtol=1.6e-2, atol=2e-2)
    torch.testing.assert_close(k, two_k, rtol=1.6e-2, atol=2e-2)
    kept = slots >= 0
    for name, rows, scale in (("key_cache", k, inputs[10]), ("value_cache", v, inputs[11])):
        out = before[name]
        scaled = rows[kept].float() / (scale if cache_dtype != torch.bfloat16 else 1.0)
        out.view(-1, *out.shape[2:])[slots[kept]] = scaled.to(cache_dtype)
        assert torch.equal(tensors[name].view(torch.uint8), out.view(torch.uint8)), name


def test_public_op_captures_into_a_cuda_graph():
    import cutetune

    inputs = _inputs(torch.float8_e4m3fn, tokens=64)
    tensors = dict(zip(NAMES, inputs, strict=True))
    problem = _problem(q_heads=4, tokens=64, kv_cache=FP8)
    # Compile outside the capture.
    cutetune.qk_norm_rope_kv(*(t.clone() for t in inputs), 1e6)
    expected = KERNEL.reference(tensors, problem)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        cutetune.qk_norm_rope_kv(*inputs, 1e6)
    graph.replay()
    torch.cuda.synchronize()
    check_outputs(KERNEL, problem, tensors, expected)


def _replace(index, value):
    return lambda inputs: tuple(value(t) if i == index else t for i, t in enumerate(inputs))


@pytest.mark.parametrize(("mutate", "message"), [
    (_replace(7, lambda s: torch.cat((s, s))), "slot_mapping must be a contiguous (5,)"),
    (_replace(7, lambda s: s.int()), "slot_mapping has dtype torch.int32"),
    (_replace(8, lambda c: c.half()), "key_cache has dtype torch.float16"),
    (_replace(9, lambda c: c.view(c.shape[0] * 2, c.shape[1] // 2, *c.shape[2:])),
     "value_cache must be key_cache's shape"),
    (_replace(3, lambda v: v[:, :1]), "v must be k's shape"),
    (_replace(10, lambda s: s.double()), "k_scale must be a float32 tensor of one element"),
])
def test_public_op_rejects_bad_input_after_a_good_call(mutate, message):
    # The good call makes the route serve this key; the bad one must still meet the op's
    # checks (the compiled kernel refuses it before any launch, then the checked path names
    # the argument), not write past the end of a cache or read past the slots.
    import cutetune

    cutetune.qk_norm_rope_kv(*_inputs(torch.float8_e4m3fn), 1e6)
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        cutetune.qk_norm_rope_kv(*mutate(_inputs(torch.float8_e4m3fn)), 1e6)

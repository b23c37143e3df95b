"""RoPE on the GPU: every code path's covering points (every valid point under the `sweep`
marker) against the float64 reference on q and k views of a fused qkv buffer, positions up to
the maximum context, multimodal RoPE's three position streams, the public op, graphs and the
route's refusals."""

from __future__ import annotations

import re

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.device.verify import check_outputs, verify
from cutetune.kernels import rope
from testkit.compiled_points import compile_all, compiled
from testkit.covering_points import WHICH_POINTS, selected_points
from testkit.every_point import assert_every_point

pytestmark = pytest.mark.gpu

H200 = DEVICE_SPECS["H200"]
# Odd token count: the last block is partial, so the tail guard is exercised.
TOKENS = 37


# Llama 3.1's scaling.
LLAMA3 = dict(scaling=rope.LLAMA3, scaling_factor=8.0, low_freq_factor=1.0,
              high_freq_factor=4.0, original_max_position=8192)
# Qwen3's long-context YaRN (its attention factor transformers' default, which its cache holds);
# gpt-oss's, whose ramp's ends are not rounded.
YARN = dict(scaling=rope.YARN, scaling_factor=4.0, original_max_position=32768,
            attention_factor=rope.yarn_attention_factor(4.0))
GPT_OSS_YARN = dict(scaling=rope.YARN, scaling_factor=32.0, original_max_position=4096,
                    truncate=False, attention_factor=rope.yarn_attention_factor(32.0))
# Gemma 3 4B to 27B's full-attention layers: every frequency divided by 8.
LINEAR = dict(scaling=rope.LINEAR, scaling_factor=8.0)
# Qwen3-VL's multimodal RoPE (interleaved) and Qwen2-VL's (runs of pairs per stream).
MROPE_INTERLEAVED = dict(mrope=rope.MROPE_INTERLEAVED, mrope_t=24, mrope_h=20, mrope_w=20)
MROPE_SECTIONS = dict(mrope=rope.MROPE_SECTIONS, mrope_t=16, mrope_h=24, mrope_w=24)


def _problem(dtype="bfloat16", head_dim=128, rotary_dim=128, style=rope.NEOX,
             positions="int64", cache=None, q_heads=6, kv_heads=2, theta=1e6,
             tokens=TOKENS, scaling=None) -> rope.RopeProblem:
    return rope.RopeProblem(num_tokens=tokens, dtype=dtype, head_dim=head_dim,
                            rotary_dim=rotary_dim, q_heads=q_heads, kv_heads=kv_heads,
                            style=style, positions_dtype=positions, cache_dtype=cache or dtype,
                            theta=theta, **(scaling or {}))


# Every code path: each style, full and partial rotary, int32 and int64 positions, a cache of
# q's dtype and of fp32, each dtype and head dim, Llama 3's, YaRN's and linear scalings;
# covering_points
# adds both cos/sin sources.
PATHS = [
    pytest.param(_problem(), id="bf16-neox-full-int64"),
    pytest.param(_problem(style=rope.GPTJ), id="bf16-gptj-full-int64"),
    pytest.param(_problem(rotary_dim=64, style=rope.GPTJ, positions="int32", cache="float32"),
                 id="bf16-gptj-partial-int32-fp32cache"),
    pytest.param(_problem(head_dim=256, rotary_dim=64, cache="float32", q_heads=16,
                          kv_heads=2, theta=1e7), id="bf16-neox-d256-quarter"),
    pytest.param(_problem(dtype="float16", head_dim=64, rotary_dim=64, positions="int32"),
                 id="fp16-neox-d64-int32"),
    pytest.param(_problem(dtype="float32", head_dim=256, rotary_dim=128, style=rope.GPTJ,
                          theta=1e4), id="fp32-gptj-d256-half"),
    pytest.param(_problem(dtype="float32", rotary_dim=32, positions="int32"),
                 id="fp32-neox-narrow-int32"),
    pytest.param(_problem(theta=5e5, scaling=LLAMA3), id="bf16-neox-llama3"),
    pytest.param(_problem(dtype="float32", rotary_dim=64, style=rope.GPTJ, theta=5e5,
                          cache="float32", scaling=LLAMA3), id="fp32-gptj-partial-llama3"),
    pytest.param(_problem(scaling=YARN), id="bf16-neox-yarn"),
    pytest.param(_problem(dtype="float32", head_dim=64, rotary_dim=32, style=rope.GPTJ,
                          theta=1.5e5, cache="float32", scaling=GPT_OSS_YARN),
                 id="fp32-gptj-partial-yarn-untruncated"),
    pytest.param(_problem(q_heads=32, kv_heads=16, scaling=LINEAR), id="bf16-neox-linear"),
    pytest.param(_problem(dtype="float32", rotary_dim=64, style=rope.GPTJ, positions="int32",
                          cache="float32", scaling=LINEAR), id="fp32-gptj-partial-int32-linear"),
    pytest.param(_problem(theta=5e6, scaling=MROPE_INTERLEAVED), id="bf16-neox-mrope-interleaved"),
    pytest.param(_problem(style=rope.GPTJ, positions="int32", scaling=MROPE_SECTIONS),
                 id="bf16-gptj-int32-mrope-sections"),
]


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("problem", PATHS)
def test_points_match_reference(problem, which):
    points = selected_points(which, rope.KERNEL, problem, H200)
    assert {p.cos_sin for p in points} == {rope.CACHE, rope.COMPUTED}
    compile_all(rope.KERNEL, problem, points)
    assert_every_point(points, lambda i, config: verify(
        rope.KERNEL, problem, compiled(rope.KERNEL, problem, config), torch.device("cuda"),
        seed=i), problem.describe())


@pytest.mark.parametrize("tokens", [1, 2, 1000, 4097])
def test_token_count_is_dynamic(tokens):
    problem = _problem()
    default = compiled(rope.KERNEL, problem, rope.default_config(problem, H200))
    verify(rope.KERNEL, problem.with_tokens(tokens), default, torch.device("cuda"), seed=tokens)


@pytest.mark.parametrize("scaling", [None, LLAMA3, YARN, LINEAR],
                         ids=["theta", "llama3", "yarn", "linear"])
@pytest.mark.parametrize("cos_sin", [rope.CACHE, rope.COMPUTED])
@pytest.mark.parametrize("style", [rope.NEOX, rope.GPTJ])
def test_positions_up_to_the_maximum_context_in_fp32(style, cos_sin, scaling):
    # fp32 heads and cache, so the tolerance is fp32's (1e-5): an angle computed in fp32 at
    # these positions is off by up to 0.06 rad and fails; the fp64 angle passes.
    max_position = 1 << 20
    problem = _problem(dtype="float32", style=style, tokens=64, theta=5e5, scaling=scaling)
    g = torch.Generator("cuda").manual_seed(7)
    qkv = torch.randn(64, 10, 128, device="cuda", generator=g)
    positions = max_position - 1 - torch.arange(64, device="cuda") * 4099
    cache = torch.full((max_position, 128), float("nan"), device="cuda")
    cache[positions] = rope.cos_sin_table(positions, 128, 5e5, problem.llama3,
                                          problem.yarn, problem.linear).float()
    tensors = {"positions": positions, "q": qkv[:, :6], "k": qkv[:, 6:8],
               "cos_sin_cache": cache}
    expected = rope.reference(tensors, problem)
    config = rope.RopeConfig(cos_sin, 128, 1, 4)
    rope.KERNEL.launch(compiled(rope.KERNEL, problem, config), tensors)
    torch.cuda.synchronize()
    check_outputs(rope.KERNEL, problem, tensors, expected)


def _inputs(tokens=5, q_heads=4, kv_heads=2, d=128, rotary_dim=128, dtype=torch.bfloat16,
            positions_dtype=torch.int64, theta=1e6, **scaled):
    """positions, q and k as views of a fused qkv buffer, the cos_sin_cache of every position
    up to 8192 (float64 angles, rounded once to q's dtype, in which vLLM holds its cache),
    scaled as `scaled` (cos_sin_table's llama3, yarn and linear) says."""
    g = torch.Generator("cuda").manual_seed(0)
    qkv = torch.randn(tokens, q_heads + 2 * kv_heads, d, device="cuda", generator=g).to(dtype)
    positions = torch.randint(0, 8192, (tokens,), device="cuda", generator=g,
                              dtype=positions_dtype)
    cache = rope.cos_sin_table(torch.arange(8192, device="cuda"), rotary_dim, theta,
                               **scaled).to(dtype)
    return positions, qkv[:, :q_heads], qkv[:, q_heads:q_heads + kv_heads], cache


@pytest.mark.parametrize("scaling", [None, LLAMA3, YARN, LINEAR],
                         ids=["theta", "llama3", "yarn", "linear"])
@pytest.mark.parametrize("rotary_dim", [128, 64])
@pytest.mark.parametrize("is_neox", [True, False])
def test_public_op_matches_reference(is_neox, rotary_dim, scaling):
    import cutetune

    problem = _problem(rotary_dim=rotary_dim, style=rope.NEOX if is_neox else rope.GPTJ,
                       positions="int32", q_heads=4, tokens=5, scaling=scaling)
    positions, q, k, cache = _inputs(rotary_dim=rotary_dim, positions_dtype=torch.int32,
                                     llama3=problem.llama3, yarn=problem.yarn,
                                     linear=problem.linear)
    qkv = q._base
    v_before = qkv[:, 6:].clone()
    tensors = {"positions": positions, "q": q, "k": k, "cos_sin_cache": cache}
    expected = rope.reference(tensors, problem)
    cutetune.rope(positions, q, k, cache, 1e6, is_neox, **(scaling or {}))
    torch.cuda.synchronize()
    check_outputs(rope.KERNEL, problem, tensors, expected)
    assert torch.equal(qkv[:, 6:], v_before)


@pytest.mark.parametrize(("fields", "interleaved"), [(MROPE_INTERLEAVED, True),
                                                      (MROPE_SECTIONS, False)],
                         ids=["interleaved", "sections"])
def test_public_op_mrope_matches_reference(fields, interleaved):
    import cutetune

    problem = _problem(q_heads=4, tokens=5, scaling=fields)
    _, q, k, cache = _inputs()
    positions = torch.randint(0, 8192, (3, 5), device="cuda",
                              generator=torch.Generator("cuda").manual_seed(3))
    tensors = {"positions": positions, "q": q, "k": k, "cos_sin_cache": cache}
    expected = rope.reference(tensors, problem)
    section = (fields["mrope_t"], fields["mrope_h"], fields["mrope_w"])
    cutetune.rope(positions, q, k, cache, 1e6, mrope_section=section,
                  mrope_interleaved=interleaved)
    torch.cuda.synchronize()
    check_outputs(rope.KERNEL, problem, tensors, expected)
    # A call of the same key with one position per token is refused before any launch.
    with pytest.raises(ValueError, match=re.escape("positions must be (3, 5) under mrope")):
        cutetune.rope(positions[0], q, k, cache, 1e6, mrope_section=section,
                      mrope_interleaved=interleaved)


# DeepSeek-V3's YaRN (mscale and mscale_all_dim 1: attention factor 1).
DEEPSEEK_YARN = dict(scaling=rope.YARN, scaling_factor=40.0, original_max_position=4096,
                     attention_factor=1.0)


@pytest.mark.parametrize("scaling", [None, DEEPSEEK_YARN], ids=["theta", "deepseek-yarn"])
def test_mlas_strided_q_pe_and_k_pe_after_a_contiguous_call_of_the_same_key(scaling):
    """MLA's layout (DeepSeek-V3's dims, 16 heads): q_pe the last 64 of each 192-wide q head,
    k_pe the last 64 of each token's 576-wide kv_a row, GPT-J pairs. A contiguous call of the
    same problem first makes the route serve the key: the strided call is served by the same
    compiled kernel, its head stride a runtime value, and leaves the dims beside untouched."""
    import cutetune

    problem = _problem(head_dim=64, rotary_dim=64, style=rope.GPTJ, q_heads=16, kv_heads=1,
                       tokens=TOKENS, theta=1e4, scaling=scaling)
    g = torch.Generator("cuda").manual_seed(5)
    positions = torch.randint(0, 1 << 17, (TOKENS,), device="cuda", generator=g)
    cache = rope.cos_sin_table(torch.arange(1 << 17, device="cuda"), 64, 1e4,
                               yarn=problem.yarn).to(torch.bfloat16)
    dense = torch.randn(TOKENS, 17, 64, device="cuda", generator=g).to(torch.bfloat16)
    cutetune.rope(positions, dense[:, :16], dense[:, 16:], cache, 1e4, False, **(scaling or {}))
    q_full = torch.randn(TOKENS, 16, 192, device="cuda", generator=g).to(torch.bfloat16)
    kv_a = torch.randn(TOKENS, 576, device="cuda", generator=g).to(torch.bfloat16)
    q_pe, k_pe = q_full[..., 128:], kv_a[:, 512:].unsqueeze(1)
    tensors = {"positions": positions, "q": q_pe, "k": k_pe, "cos_sin_cache": cache}
    expected = rope.reference(tensors, problem)
    nope, latent = q_full[..., :128].clone(), kv_a[:, :512].clone()
    cutetune.rope(positions, q_pe, k_pe, cache, 1e4, False, **(scaling or {}))
    torch.cuda.synchronize()
    check_outputs(rope.KERNEL, problem, tensors, expected)
    assert torch.equal(q_full[..., :128], nope) and torch.equal(kv_a[:, :512], latent)
    # A head stride off the 16-byte grid, after both: refused by name before any launch.
    q_odd = torch.zeros(TOKENS, 16, 68, device="cuda", dtype=torch.bfloat16)[..., :64]
    with pytest.raises(ValueError, match=re.escape("must be multiples of 16 bytes")):
        cutetune.rope(positions, q_odd, k_pe, cache, 1e4, False, **(scaling or {}))


def test_public_op_captures_into_a_cuda_graph():
    import cutetune

    positions, q, k, cache = _inputs(tokens=64)
    tensors = {"positions": positions, "q": q, "k": k, "cos_sin_cache": cache}
    problem = _problem(q_heads=4, tokens=64)
    cutetune.rope(positions, q.clone(), k.clone(), cache, 1e6)  # compile outside the capture
    expected = rope.reference(tensors, problem)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        cutetune.rope(positions, q, k, cache, 1e6)
    graph.replay()
    torch.cuda.synchronize()
    check_outputs(rope.KERNEL, problem, tensors, expected)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda p, q, k, c: (p[:3], q, k, c), "positions must be (5,), one per token of q"),
    (lambda p, q, k, c: (p.float(), q, k, c), "positions has dtype torch.float32"),
    (lambda p, q, k, c: (p, q, k, c[:, :64].contiguous().half()), "cos_sin_cache has dtype"),
    (lambda p, q, k, c: (p, q, k, torch.cat((c, c), 1)), "rotary_dim (cos_sin_cache's width)"),
    (lambda p, q, k, c: (p, q, k.half(), c), "k has dtype torch.float16"),
])
def test_public_op_rejects_bad_input_after_a_good_call(mutate, message):
    # The good call makes the route serve this key; the bad one must still meet the op's
    # checks (the compiled kernel refuses it before any launch, then the checked path names
    # the argument), not read past the end of positions.
    import cutetune

    good = _inputs()
    cutetune.rope(*good, 1e6)
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        cutetune.rope(*mutate(*_inputs()), 1e6)

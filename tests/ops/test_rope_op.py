"""cutetune.rope on the CPU: every bad input refused with one line naming the argument before
anything touches a GPU, and the CPU path (the kernel's reference) written in place."""

import dataclasses
import math
import re

import pytest
import torch

import cutetune
from cutetune.kernels.rope import GPTJ, KERNEL, NEOX, RopeProblem, cos_sin_table

TOKENS, Q_HEADS, KV_HEADS, HEAD_DIM = 5, 4, 2, 128


def _inputs(dtype=torch.bfloat16, rotary_dim=HEAD_DIM, cache_dtype=None, positions=torch.int64,
            theta=1e4):
    """positions, q and k as views of a fused qkv buffer, and the cache of theta."""
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(TOKENS, Q_HEADS + 2 * KV_HEADS, HEAD_DIM, generator=g).to(dtype)
    pos = torch.randint(0, 4096, (TOKENS,), generator=g, dtype=positions)
    cache = cos_sin_table(torch.arange(4096), rotary_dim, theta).to(cache_dtype or dtype)
    return pos, qkv[:, :Q_HEADS], qkv[:, Q_HEADS:Q_HEADS + KV_HEADS], cache


@pytest.mark.parametrize("style", (NEOX, GPTJ))
@pytest.mark.parametrize("rotary_dim", (HEAD_DIM, 64))
def test_cpu_tensors_are_rotated_in_place_with_the_reference(style, rotary_dim):
    positions, q, k, cache = _inputs(rotary_dim=rotary_dim, positions=torch.int32)
    qkv = q._base
    q_before, v_before = q.clone(), qkv[:, Q_HEADS + KV_HEADS:].clone()
    problem = RopeProblem(num_tokens=TOKENS, dtype="bfloat16", head_dim=HEAD_DIM,
                          rotary_dim=rotary_dim, q_heads=Q_HEADS, kv_heads=KV_HEADS,
                          style=style, positions_dtype="int32", cache_dtype="bfloat16",
                          theta=1e4)
    expected = KERNEL.reference({"positions": positions, "q": q, "k": k}, problem)
    got_q, got_k = cutetune.rope(positions, q, k, cache, 1e4, is_neox=style == NEOX)
    assert got_q is q and got_k is k
    torch.testing.assert_close(q.float(), expected["q"], rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(k.float(), expected["k"], rtol=1.6e-2, atol=1e-2)
    assert not torch.equal(q, q_before)
    assert torch.equal(qkv[:, Q_HEADS + KV_HEADS:], v_before)


def test_mlas_strided_q_pe_and_k_pe_rotate_in_place_and_nothing_beside_them():
    # DeepSeek-V3's layout, scaled down: q heads of 128 dims not rotated then 64 rotated; k_pe
    # the last 64 of each token's kv_a projection (kv_lora_rank 512), one head every q head
    # shares; interleaved pairs.
    g = torch.Generator().manual_seed(3)
    q_full = torch.randn(TOKENS, Q_HEADS, 192, generator=g).to(torch.bfloat16)
    kv_a = torch.randn(TOKENS, 512 + 64, generator=g).to(torch.bfloat16)
    q_pe, k_pe = q_full[..., 128:], kv_a[:, 512:].unsqueeze(1)
    positions = torch.randint(0, 4096, (TOKENS,), generator=g)
    cache = cos_sin_table(torch.arange(4096), 64, 1e4).to(torch.bfloat16)
    problem = RopeProblem(num_tokens=TOKENS, dtype="bfloat16", head_dim=64, rotary_dim=64,
                          q_heads=Q_HEADS, kv_heads=1, style=GPTJ, positions_dtype="int64",
                          cache_dtype="bfloat16", theta=1e4)
    expected = KERNEL.reference({"positions": positions, "q": q_pe.clone(),
                                 "k": k_pe.clone()}, problem)
    nope, latent = q_full[..., :128].clone(), kv_a[:, :512].clone()
    cutetune.rope(positions, q_pe, k_pe, cache, 1e4, is_neox=False)
    torch.testing.assert_close(q_pe.float(), expected["q"], rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(k_pe.float(), expected["k"], rtol=1.6e-2, atol=1e-2)
    assert torch.equal(q_full[..., :128], nope) and torch.equal(kv_a[:, :512], latent)


def test_llama3_scaling_rotates_by_its_scaled_frequencies():
    llama3 = (8.0, 1.0, 4.0, 8192)
    positions, q, k, cache = _inputs(cache_dtype=torch.float32)
    problem = RopeProblem(num_tokens=TOKENS, dtype="bfloat16", head_dim=HEAD_DIM,
                          rotary_dim=HEAD_DIM, q_heads=Q_HEADS, kv_heads=KV_HEADS, style=NEOX,
                          positions_dtype="int64", cache_dtype="float32", theta=5e5,
                          scaling="llama3", scaling_factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position=8192)
    expected = KERNEL.reference({"positions": positions, "q": q, "k": k}, problem)
    unscaled = KERNEL.reference({"positions": positions, "q": q, "k": k},
                                RopeProblem(**{**problem.static_fields(), "num_tokens": TOKENS,
                                               "scaling": "default", "scaling_factor": 1.0,
                                               "high_freq_factor": 1.0,
                                               "original_max_position": 0}))
    assert not torch.allclose(expected["q"], unscaled["q"], atol=1e-2)
    cutetune.rope(positions, q, k, cache, 5e5, True, "llama3", *llama3)
    torch.testing.assert_close(q.float(), expected["q"], rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(k.float(), expected["k"], rtol=1.6e-2, atol=1e-2)


def test_linear_scaling_rotates_position_8p_as_theta_rotates_p():
    """Gemma 3's full-attention layers divide every frequency by 8: a token at position 8 p
    rotates as the unscaled rotation turns position p (dividing by 8 is exact)."""
    positions, q, k, cache = _inputs(cache_dtype=torch.float32)
    plain_q, plain_k = q.clone(), k.clone()
    cutetune.rope(positions * 8, q, k, cache, 1e6, True, "linear", 8.0)
    cutetune.rope(positions, plain_q, plain_k, cache, 1e6, True)
    assert torch.equal(q, plain_q) and torch.equal(k, plain_k)


# A short original context and a low theta, so that positions below 4096 turn the pairs the
# ramp blends far enough for bf16 to tell the betas and truncate apart.
YARN = dict(scaling="yarn", scaling_factor=4.0, original_max_position=512, beta_fast=16.0,
            beta_slow=2.0, truncate=False)


@pytest.mark.parametrize("attention_factor", [None, 1.5])
def test_yarn_scaling_rotates_by_its_frequencies_and_attention_factor(attention_factor):
    positions, q, k, cache = _inputs(cache_dtype=torch.float32)
    problem = RopeProblem(num_tokens=TOKENS, dtype="bfloat16", head_dim=HEAD_DIM,
                          rotary_dim=HEAD_DIM, q_heads=Q_HEADS, kv_heads=KV_HEADS, style=NEOX,
                          positions_dtype="int64", cache_dtype="float32", theta=1e4, **YARN,
                          # None: transformers' default.
                          attention_factor=attention_factor or 0.1 * math.log(4.0) + 1)
    inputs = {"positions": positions, "q": q, "k": k}
    expected = KERNEL.reference(inputs, problem)
    for other in (dict(beta_fast=32.0), dict(beta_slow=1.0), dict(truncate=True),
                  dict(attention_factor=1.25)):
        differs = KERNEL.reference(inputs, dataclasses.replace(problem, **other))
        assert not torch.allclose(expected["q"], differs["q"], rtol=1.6e-2, atol=1e-2), other
    cutetune.rope(positions, q, k, cache, 1e4, True, **YARN, attention_factor=attention_factor)
    torch.testing.assert_close(q.float(), expected["q"], rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(k.float(), expected["k"], rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize(("scaling", "message"), [
    (dict(scaling="longrope"), "scaling 'longrope' not supported: use default or llama3 or yarn"),
    (dict(scaling_factor=8.0), "the default scaling takes no factors"),
    (dict(attention_factor=1.5), "the default scaling takes no factors, got "
                                 "attention_factor=1.5"),
    (dict(scaling="llama3", scaling_factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0,
          original_max_position=8192), "llama3 scaling needs scaling_factor >= 1"),
    (dict(scaling="yarn", scaling_factor=4.0), "yarn scaling needs scaling_factor >= 1, "
                                               "original_max_position >= 1"),
    (dict(YARN, beta_slow=64.0), "0 < beta_slow <= beta_fast"),
    (dict(YARN, low_freq_factor=2.0), "the yarn scaling takes no factors, got "
                                      "low_freq_factor=2.0"),
    (dict(YARN, truncate="no"), "truncate must be True or False, got 'no'"),
    (dict(scaling="linear", scaling_factor=0.0), "linear scaling needs a finite "
                                                 "scaling_factor > 0, got scaling_factor=0.0"),
    (dict(scaling="linear", scaling_factor=8.0, beta_fast=16.0), "the linear scaling takes no "
                                                                "factors, got beta_fast=16.0"),
])
def test_bad_scaling_is_refused(scaling, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cutetune.rope(*_inputs(), 1e4, **scaling)


def test_no_tokens_is_nothing_to_do():
    positions, q, k, cache = _inputs()
    cutetune.rope(positions[:0], q[:0], k[:0], cache, 1e4)


@pytest.mark.parametrize(("mutate", "error", "message"), [
    (lambda p, q, k, c: (p.tolist(), q, k, c), TypeError,
     "positions must be a torch.Tensor, got list"),
    (lambda p, q, k, c: (p, q.double(), k, c), TypeError,
     "q has dtype torch.float64: use one of torch.bfloat16"),
    (lambda p, q, k, c: (p, q, k.half(), c), TypeError,
     "k has dtype torch.float16 but q has torch.bfloat16"),
    (lambda p, q, k, c: (p.float(), q, k, c), TypeError,
     "positions has dtype torch.float32: use torch.int32 or torch.int64"),
    (lambda p, q, k, c: (p.short(), q, k, c), TypeError,
     "positions has dtype torch.int16"),
    (lambda p, q, k, c: (p, q, k, c.half()), TypeError,
     "cos_sin_cache has dtype torch.float16: use torch.float32 or q's dtype"),
    (lambda p, q, k, c: (p[:3], q, k, c), ValueError,
     f"positions must be ({TOKENS},), one per token of q, got shape (3,)"),
    (lambda p, q, k, c: (p[:, None].expand(TOKENS, 3), q, k, c), ValueError,
     f"positions must be ({TOKENS},)"),
    (lambda p, q, k, c: (p.repeat(2)[::2], q, k, c), ValueError,
     "positions must be contiguous"),
    (lambda p, q, k, c: (p, q, k, c[:, :63]), ValueError,
     "cos_sin_cache must be a contiguous (max_position, rotary_dim) tensor"),
    (lambda p, q, k, c: (p, q, k, c[:, :63].contiguous()), ValueError,
     "rotary_dim (cos_sin_cache's width) is 63: it must be even and at most head_dim 128"),
    (lambda p, q, k, c: (p, q, k, torch.cat((c, c), 1)), ValueError,
     "rotary_dim (cos_sin_cache's width) is 256: it must be even and at most head_dim 128"),
    (lambda p, q, k, c: (p, q, k, c[0]), ValueError,
     "cos_sin_cache must be a contiguous (max_position, rotary_dim) tensor, got shape (128,)"),
    (lambda p, q, k, c: (p, q[0], k, c), ValueError,
     "q and k must be (tokens, heads, head_dim)"),
    (lambda p, q, k, c: (p, q, k[:3], c), ValueError,
     "must have q's tokens and head_dim"),
    (lambda p, q, k, c: (p, q, k[..., :64], c), ValueError,
     "must have q's tokens and head_dim"),
    (lambda p, q, k, c: (p, q.transpose(1, 2).contiguous().transpose(1, 2), k, c), ValueError,
     "q's heads must each be contiguous and apart (strides (*, at least 128, 1)), got "
     "(512, 1, 4)"),
    (lambda p, q, k, c: (p, q, k.as_strided(k.shape, (k.stride(0), 64, 1)), c), ValueError,
     "k's heads must each be contiguous and apart (strides (*, at least 128, 1)), got "
     "(1024, 64, 1)"),
    (lambda p, q, k, c: (p, q.as_strided(q.shape, (q.stride(0), 132, 1)), k, c), ValueError,
     "the token and head strides of q and k ((1024, 132), (1024, 128) elements) must be "
     "multiples of 16 bytes"),
    (lambda p, q, k, c: (p, q, k, c.to("meta")), ValueError,
     "cos_sin_cache is on meta but q is on cpu"),
    # Every position would lie past the rows.
    (lambda p, q, k, c: (p, q, k, c[:0]), ValueError,
     "cos_sin_cache has no rows: it must hold one per position (max_position, rotary_dim), "
     "got shape (0, 128)"),
])
def test_bad_input_is_one_line_naming_the_argument(mutate, error, message):
    with pytest.raises(error, match=re.escape(message)) as info:
        cutetune.rope(*mutate(*_inputs()), 1e4)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("theta", (1.0, float("inf"), -5.0, True))
def test_bad_theta_is_refused(theta):
    with pytest.raises(ValueError, match="rope_theta must be a finite number above 1"):
        cutetune.rope(*_inputs(), theta)


@pytest.mark.parametrize(("scalars", "error", "message"), [
    # Read as truthy, 'no' or None would rotate NeoX-style.
    (dict(is_neox="no"), TypeError, "is_neox must be True or False, got 'no'"),
    (dict(is_neox=None), TypeError, "is_neox must be True or False, got None"),
    (dict(is_neox=1), TypeError, "is_neox must be True or False, got 1"),
    (dict(mrope_section=(24, 20, 20), mrope_interleaved="yes"), TypeError,
     "mrope_interleaved must be True or False, got 'yes'"),
    (dict(scaling="linear", scaling_factor="8"), TypeError,
     "scaling_factor must be a number (an int or a float), got '8'"),
    (dict(YARN, beta_fast="32"), TypeError,
     "beta_fast must be a number (an int or a float), got '32'"),
    (dict(YARN, attention_factor=True), TypeError,
     "attention_factor must be a number (an int or a float), got True"),
    (dict(scaling="llama3", scaling_factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
          original_max_position=8192.0), ValueError,
     "original_max_position must be an integer of at least 0, got 8192.0"),
])
def test_bad_rotation_scalars_are_one_line_naming_the_argument(scalars, error, message):
    with pytest.raises(error, match=re.escape(message)):
        cutetune.rope(*_inputs(), 1e4, **scalars)


def test_an_fp32_cache_serves_bf16_heads():
    positions, q, k, cache = _inputs(cache_dtype=torch.float32)
    cutetune.rope(positions, q, k, cache, 1e4)


def test_tensors_on_another_device_are_refused():
    positions, q, k, cache = (t.to("meta") for t in _inputs())
    with pytest.raises(ValueError, match="q is on meta: rope runs on a CUDA device or the CPU"):
        cutetune.rope(positions, q, k, cache, 1e4)


@pytest.mark.parametrize(("section", "interleaved", "layout"), [
    ((16, 24, 24), False, "sections"), ((24, 20, 20), True, "interleaved")])
def test_mrope_rotates_each_pair_by_its_streams_position(section, interleaved, layout):
    _, q, k, cache = _inputs()
    positions = torch.randint(0, 4096, (3, TOKENS), generator=torch.Generator().manual_seed(1))
    t, h, w = section
    problem = RopeProblem(num_tokens=TOKENS, dtype="bfloat16", head_dim=HEAD_DIM,
                          rotary_dim=HEAD_DIM, q_heads=Q_HEADS, kv_heads=KV_HEADS, style=NEOX,
                          positions_dtype="int64", cache_dtype="bfloat16", theta=1e4,
                          mrope=layout, mrope_t=t, mrope_h=h, mrope_w=w)
    expected = KERNEL.reference({"positions": positions, "q": q, "k": k}, problem)
    cutetune.rope(positions, q, k, cache, 1e4, mrope_section=section,
                  mrope_interleaved=interleaved)
    torch.testing.assert_close(q.float(), expected["q"], rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(k.float(), expected["k"], rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize(("positions_shape", "mrope", "message"), [
    ((TOKENS,), dict(mrope_section=(24, 20, 20)),
     f"positions must be (3, {TOKENS}) under mrope, a temporal, a height and a width position "
     f"per token of q, got shape ({TOKENS},)"),
    ((3, TOKENS), {}, f"positions must be ({TOKENS},), one per token of q, got shape "
                      f"(3, {TOKENS})"),
    ((3, TOKENS), dict(mrope_section=(24, 20)), "mrope_section must be three counts of pairs"),
    ((3, TOKENS), dict(mrope_section=64), "mrope_section must be three counts of pairs "
                                          "(temporal, height, width), got 64"),
    ((3, TOKENS), dict(mrope_section=(24, 20, 19)), "must be at least 0 each and sum to "
                                                    "rotary_dim / 2 = 64"),
    ((TOKENS,), dict(mrope_interleaved=True), "mrope_interleaved is set but mrope_section is "
                                              "None"),
])
def test_bad_mrope_input_is_one_line_naming_the_argument(positions_shape, mrope, message):
    _, q, k, cache = _inputs()
    positions = torch.zeros(positions_shape, dtype=torch.int64)
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        cutetune.rope(positions, q, k, cache, 1e4, **mrope)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("mrope", [{}, dict(mrope_section=(24, 20, 20), mrope_interleaved=True)],
                         ids=["one-stream", "mrope"])
def test_compiles_as_the_mutating_custom_op(mrope):
    """torch.compile(fullgraph=True) records cutetune::rope with the call's arguments (the
    custom op takes the mrope fields the op makes of mrope_section), and the graph rotates as
    the eager op does."""
    positions, q, k, cache = _inputs()
    if mrope:
        positions = torch.randint(0, 4096, (3, TOKENS), generator=torch.Generator().manual_seed(1))
    expected_q, expected_k = (x.clone() for x in (q, k))
    cutetune.rope(positions, expected_q, expected_k, cache, 1e4, **mrope)
    graphs = []

    def recording_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    def rotate(positions, q, k, cache):
        cutetune.rope(positions, q, k, cache, 1e4, **mrope)
        return q * 1, k * 1

    torch._dynamo.reset()
    got_q, got_k = torch.compile(rotate, fullgraph=True, backend=recording_backend)(
        positions, q, k, cache)
    (graph,) = graphs
    assert any("cutetune.rope" in str(node.target) for node in graph.graph.nodes)
    assert torch.equal(got_q, expected_q) and torch.equal(got_k, expected_k)

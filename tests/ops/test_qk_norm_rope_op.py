"""cutetune.qk_norm_rope on the CPU: every bad input refused with one line naming the argument
before anything touches a GPU, and the CPU path (the kernel's reference) written in place, equal
to cutetune.qk_norm then cutetune.rope."""

import re

import pytest
import torch

import cutetune
from cutetune.kernels.qk_norm_rope import KERNEL, QKNormRopeProblem
from cutetune.kernels.rope import GPTJ, NEOX, cos_sin_table

TOKENS, Q_HEADS, KV_HEADS, HEAD_DIM = 5, 4, 2, 128


def _inputs(dtype=torch.bfloat16, rotary_dim=HEAD_DIM, cache_dtype=None, positions=torch.int64,
            theta=1e4):
    """positions, q and k as views of a fused qkv buffer, the weights, and the cache of
    theta."""
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(TOKENS, Q_HEADS + 2 * KV_HEADS, HEAD_DIM, generator=g).to(dtype)
    pos = torch.randint(0, 4096, (TOKENS,), generator=g, dtype=positions)
    weights = (1 + 0.5 * torch.randn(2, HEAD_DIM, generator=g)).to(dtype)
    cache = cos_sin_table(torch.arange(4096), rotary_dim, theta).to(cache_dtype or dtype)
    return (pos, qkv[:, :Q_HEADS], qkv[:, Q_HEADS:Q_HEADS + KV_HEADS], weights[0], weights[1],
            cache)


@pytest.mark.parametrize(("style", "rotary_dim", "weight_bias"),
                         [(NEOX, HEAD_DIM, 0.0), (NEOX, 32, 1.0), (GPTJ, 64, 0.0)])
def test_cpu_tensors_are_normalised_then_rotated_in_place(style, rotary_dim, weight_bias):
    positions, q, k, q_weight, k_weight, cache = _inputs(rotary_dim=rotary_dim,
                                                         positions=torch.int32)
    qkv = q._base
    q_before, v_before = q.clone(), qkv[:, Q_HEADS + KV_HEADS:].clone()
    problem = QKNormRopeProblem(
        num_tokens=TOKENS, dtype="bfloat16", head_dim=HEAD_DIM, rotary_dim=rotary_dim,
        q_heads=Q_HEADS, kv_heads=KV_HEADS, style=style, positions_dtype="int32",
        cache_dtype="bfloat16", theta=1e4, eps=1e-6, weight_bias=weight_bias)
    expected = KERNEL.reference({"positions": positions, "q": q, "k": k, "q_weight": q_weight,
                                 "k_weight": k_weight}, problem)
    # The unfused path: the two ops one after the other, on a copy.
    two_q, two_k = (t.clone() for t in (q, k))
    cutetune.qk_norm(two_q, two_k, q_weight, k_weight, 1e-6, weight_bias)
    cutetune.rope(positions, two_q, two_k, cache, 1e4, style == NEOX)
    got_q, got_k = cutetune.qk_norm_rope(positions, q, k, q_weight, k_weight, cache, 1e4, 1e-6,
                                         weight_bias, is_neox=style == NEOX)
    assert got_q is q and got_k is k
    for got, unfused, name in ((q, two_q, "q"), (k, two_k, "k")):
        torch.testing.assert_close(got.float(), expected[name], rtol=1.6e-2, atol=1e-2)
        # The unfused path rounds to bf16 between the two: within a rounding of each other.
        torch.testing.assert_close(got, unfused, rtol=1.6e-2, atol=2e-2)
    assert not torch.equal(q, q_before)
    assert torch.equal(qkv[:, Q_HEADS + KV_HEADS:], v_before)


def test_llama3_scaling_reaches_the_rotation():
    llama3 = (8.0, 1.0, 4.0, 8192)
    inputs = _inputs(cache_dtype=torch.float32)
    plain = [t.clone() for t in inputs]
    cutetune.qk_norm_rope(*inputs, 5e5, 1e-6, 0.0, True, "llama3", *llama3)
    cutetune.qk_norm_rope(*plain, 5e5)
    assert not torch.allclose(inputs[1].float(), plain[1].float(), atol=1e-1)


def test_linear_scaling_reaches_the_rotation():
    # Every frequency divided by 8: position 8 p rotates as the unscaled position p does.
    inputs = _inputs(cache_dtype=torch.float32)
    plain = [t.clone() for t in inputs]
    cutetune.qk_norm_rope(inputs[0] * 8, *inputs[1:], 1e6, 1e-6, 0.0, True, "linear", 8.0)
    cutetune.qk_norm_rope(*plain, 1e6)
    assert torch.equal(inputs[1], plain[1]) and torch.equal(inputs[2], plain[2])


@pytest.mark.parametrize(("scalars", "message"), [
    (dict(scaling="yarn", scaling_factor=4.0, original_max_position=32768),
     "scaling 'yarn' not supported by qk_norm_rope"),
    (dict(scaling_factor=8.0), "the default scaling takes no factors"),
    (dict(scaling="linear", scaling_factor=-1.0), "linear scaling needs a finite "
                                                  "scaling_factor > 0"),
    (dict(eps=0.0), "eps must be a finite number above 0, got 0.0"),
    (dict(eps=float("inf")), "eps must be a finite number above 0, got inf"),
    (dict(weight_bias=True), "weight_bias must be 0 or 1 (Gemma-style), got True"),
    (dict(scaling="llama3", scaling_factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
          original_max_position=8192.0),
     "original_max_position must be an integer of at least 0, got 8192.0"),
    (dict(weight_bias=0.5), "weight_bias must be 0 or 1"),
])
def test_bad_scalars_are_refused(scalars, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cutetune.qk_norm_rope(*_inputs(), 1e4, **scalars)


def test_no_tokens_is_nothing_to_do():
    positions, q, k, q_weight, k_weight, cache = _inputs()
    cutetune.qk_norm_rope(positions[:0], q[:0], k[:0], q_weight, k_weight, cache, 1e4)


def _replace(index, value):
    return lambda inputs: tuple(value(t) if i == index else t for i, t in enumerate(inputs))


@pytest.mark.parametrize(("mutate", "error", "message"), [
    (_replace(0, lambda p: p.tolist()), TypeError, "positions must be a torch.Tensor, got list"),
    (_replace(1, lambda q: q.double()), TypeError,
     "q has dtype torch.float64: use one of torch.bfloat16"),
    (_replace(2, lambda k: k.half()), TypeError,
     "k has dtype torch.float16 but q has torch.bfloat16"),
    (_replace(0, lambda p: p.float()), TypeError,
     "positions has dtype torch.float32: use torch.int32 or torch.int64"),
    (_replace(3, lambda w: w.float()), TypeError,
     "q_weight has dtype torch.float32 but q has torch.bfloat16"),
    (_replace(4, lambda w: w.tolist()), TypeError, "k_weight must be a torch.Tensor, got list"),
    (_replace(5, lambda c: c.half()), TypeError,
     "cos_sin_cache has dtype torch.float16: use torch.float32 or q's dtype"),
    (_replace(0, lambda p: p[:3]), ValueError,
     f"positions must be ({TOKENS},), one per token of q, got shape (3,)"),
    (_replace(5, lambda c: c[:, :63].contiguous()), ValueError,
     "rotary_dim (cos_sin_cache's width) is 63: it must be even and at most head_dim 128"),
    (_replace(3, lambda w: w[:64]), ValueError,
     "q_weight and k_weight must be contiguous (128,) vectors"),
    (_replace(4, lambda w: torch.stack((w, w), 1)[:, 0]), ValueError,
     "q_weight and k_weight must be contiguous (128,) vectors"),
    (lambda inputs: (inputs[0], inputs[1][..., :96].contiguous(),
                     inputs[2][..., :96].contiguous(), inputs[3][:96], inputs[4][:96],
                     inputs[5][:, :96].contiguous()), ValueError,
     "head_dim 96 is not supported"),
    (_replace(1, lambda q: q[0]), ValueError, "q and k must be (tokens, heads, head_dim)"),
    (_replace(1, lambda q: q.transpose(1, 2).contiguous().transpose(1, 2)), ValueError,
     "q's heads must each be contiguous and apart"),
    # Apart, as rope takes MLA's q_pe, but not contiguous, as the norm reads them.
    (_replace(1, lambda q: torch.cat((q, q), 2)[..., :128]), ValueError,
     "the heads of q and k must be contiguous"),
    (_replace(5, lambda c: c.to("meta")), ValueError, "cos_sin_cache is on meta but q is on cpu"),
    (_replace(3, lambda w: w.to("meta")), ValueError, "q_weight is on meta but q is on cpu"),
    (_replace(5, lambda c: c[:0]), ValueError, "cos_sin_cache has no rows"),
])
def test_bad_input_is_one_line_naming_the_argument(mutate, error, message):
    with pytest.raises(error, match=re.escape(message)) as info:
        cutetune.qk_norm_rope(*mutate(_inputs()), 1e4)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("theta", (1.0, float("inf"), True))
def test_bad_theta_is_refused(theta):
    with pytest.raises(ValueError, match="rope_theta must be a finite number above 1"):
        cutetune.qk_norm_rope(*_inputs(), theta)


@pytest.mark.parametrize("is_neox", ("no", None, 1))
def test_is_neox_must_be_a_bool(is_neox):
    # Read as truthy, 'no' or None would rotate NeoX-style.
    with pytest.raises(TypeError, match=re.escape(f"is_neox must be True or False, got "
                                                  f"{is_neox!r}")):
        cutetune.qk_norm_rope(*_inputs(), 1e4, is_neox=is_neox)

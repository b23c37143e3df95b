"""cutetune.qk_norm_rope_kv on the CPU: every bad input refused with one line naming the argument
before anything touches a GPU, and the CPU path (the kernel's reference) equal to
cutetune.qk_norm_rope followed by vLLM's reshape_and_cache_flash written in torch."""

import re

import pytest
import torch

import cutetune
from cutetune.kernels.rope import cos_sin_table
from cutetune.ops.registry import route_of

TOKENS, Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK, BLOCKS = 7, 4, 2, 128, 4, 3
FP8 = torch.float8_e4m3fn


def _inputs(cache_dtype=torch.bfloat16):
    """positions, q, k and v as views of a fused qkv buffer, the weights, the cos and sin cache,
    a slot mapping with padding, caches filled with 96s, and the scales."""
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(TOKENS, Q_HEADS + 2 * KV_HEADS, HEAD_DIM, generator=g).bfloat16()
    pos = torch.randint(0, 4096, (TOKENS,), generator=g)
    weights = (1 + 0.5 * torch.randn(2, HEAD_DIM, generator=g)).bfloat16()
    cache = cos_sin_table(torch.arange(4096), HEAD_DIM, 1e4).bfloat16()
    slots = torch.tensor([5, -1, 0, 11, -1, 2, 8])
    caches = torch.full((2, BLOCKS, BLOCK, KV_HEADS, HEAD_DIM), 96.0).to(cache_dtype)
    return (pos, qkv[:, :Q_HEADS], qkv[:, Q_HEADS:Q_HEADS + KV_HEADS],
            qkv[:, Q_HEADS + KV_HEADS:], weights[0], weights[1], cache, slots, caches[0],
            caches[1], torch.tensor([0.125]), torch.tensor([0.03125]))


@pytest.mark.parametrize("cache_dtype", (torch.bfloat16, FP8))
def test_cpu_path_is_qk_norm_rope_then_reshape_and_cache(cache_dtype):
    inputs = _inputs(cache_dtype)
    positions, q, k, v, q_weight, k_weight, cache, slots, key_cache, value_cache, k_scale, \
        v_scale = inputs
    # The unfused path on copies: qk_norm_rope, then reshape_and_cache_flash in torch.
    two_q, two_k = q.clone(), k.clone()
    cutetune.qk_norm_rope(positions, two_q, two_k, q_weight, k_weight, cache, 1e4)
    expected_key, expected_value = key_cache.float().clone(), value_cache.float().clone()
    kept = slots >= 0
    scales = (k_scale, v_scale) if cache_dtype == FP8 else (1.0, 1.0)
    for expected, rows, scale in ((expected_key, two_k, scales[0]),
                                  (expected_value, v, scales[1])):
        flat = expected.view(-1, KV_HEADS, HEAD_DIM)
        flat[slots[kept]] = (rows[kept].float() / scale).to(cache_dtype).float()
    v_before = v.clone()
    got = cutetune.qk_norm_rope_kv(*inputs, 1e4)
    assert got[0] is q and got[1] is k
    assert torch.equal(v, v_before)
    torch.testing.assert_close(q, two_q, rtol=1.6e-2, atol=2e-2)
    torch.testing.assert_close(k, two_k, rtol=1.6e-2, atol=2e-2)
    assert key_cache.dtype is cache_dtype
    # Within a rounding of the cache's type (k itself may differ by one bf16 rounding).
    rtol = 0.14 if cache_dtype == FP8 else 1.6e-2
    for got_cache, expected in ((key_cache, expected_key), (value_cache, expected_value)):
        torch.testing.assert_close(got_cache.float(), expected, rtol=rtol, atol=2e-2 / 0.125)
    # The slots of no token (and those of padding) keep their 96s (exact in FP8 too).
    written = torch.zeros(BLOCKS * BLOCK, dtype=torch.bool)
    written[slots[kept]] = True
    for got_cache in (key_cache, value_cache):
        assert (got_cache.float().view(-1, KV_HEADS, HEAD_DIM)[~written] == 96).all()


def test_no_tokens_is_nothing_to_do():
    inputs = list(_inputs())
    for i in (0, 1, 2, 3, 7):
        inputs[i] = inputs[i][:0]
    before = inputs[8].clone()
    cutetune.qk_norm_rope_kv(*inputs, 1e4)
    assert torch.equal(inputs[8], before)


def _replace(index, value):
    return lambda inputs: tuple(value(t) if i == index else t for i, t in enumerate(inputs))


@pytest.mark.parametrize(("mutate", "error", "message"), [
    # qk_norm_rope's checks come first
    (_replace(1, lambda q: q.double()), TypeError,
     "q has dtype torch.float64: use one of torch.bfloat16"),
    (_replace(3, lambda v: v.tolist()), TypeError, "v must be a torch.Tensor, got list"),
    (_replace(3, lambda v: v.half()), TypeError,
     "v has dtype torch.float16 but q has torch.bfloat16"),
    (_replace(3, lambda v: v[:, :1]), ValueError, "v must be k's shape (7, 2, 128)"),
    (_replace(7, lambda s: s.int()), TypeError,
     "slot_mapping has dtype torch.int32: use torch.int64"),
    (_replace(7, lambda s: torch.cat((s, s))), ValueError,
     "slot_mapping must be a contiguous (7,), one slot per token of q, got shape (14,)"),
    (_replace(8, lambda c: c.half()), TypeError,
     "key_cache has dtype torch.float16: use q's dtype torch.bfloat16 or torch.float8_e4m3fn"),
    (_replace(9, lambda c: c.to(FP8)), TypeError,
     "value_cache has dtype torch.float8_e4m3fn but key_cache has torch.bfloat16"),
    (_replace(8, lambda c: c[..., :64]), ValueError,
     "key_cache must be (num_blocks, block_size, kv_heads 2, head_dim 128), got shape "
     "(3, 4, 2, 64)"),
    (_replace(9, lambda c: c.view(BLOCKS * 2, BLOCK // 2, KV_HEADS, HEAD_DIM)), ValueError,
     "value_cache must be key_cache's shape (3, 4, 2, 128) (its blocks of 4 slots), got "
     "(6, 2, 2, 128)"),
    (_replace(8, lambda c: c.transpose(1, 2).contiguous().transpose(1, 2)), ValueError,
     "key_cache must hold each block's 1024 elements contiguous"),
    (_replace(10, lambda s: s.double()), ValueError,
     "k_scale must be a float32 tensor of one element, got torch.float64 of shape (1,)"),
    (_replace(11, lambda s: torch.ones(2)), ValueError,
     "v_scale must be a float32 tensor of one element, got torch.float32 of shape (2,)"),
    (_replace(9, lambda c: c.to("meta")), ValueError, "value_cache is on meta but q is on cpu"),
    # No block to write into: every slot would lie past the caches.
    (lambda inputs: (*inputs[:8], inputs[8][:0], inputs[9][:0], *inputs[10:]), ValueError,
     "key_cache must hold at least one block of 4 slots, got shape (0, 4, 2, 128)"),
    (_replace(6, lambda c: c[:0]), ValueError, "cos_sin_cache has no rows"),
])
def test_bad_input_is_one_line_naming_the_argument(mutate, error, message):
    with pytest.raises(error, match=re.escape(message)) as info:
        cutetune.qk_norm_rope_kv(*mutate(_inputs()), 1e4)
    assert "\n" not in str(info.value)


def test_the_fast_path_sends_empty_caches_to_the_checks():
    # Its key holds no block or row count: without these a call with none would launch.
    nonempty = {(d.argument, d.dim) for d in route_of("qk_norm_rope_kv").fast_call.nonempty}
    assert {("key_cache", 0), ("value_cache", 0), ("cos_sin_cache", 0)} <= nonempty


@pytest.mark.parametrize(("scalars", "error", "message"), [
    (dict(is_neox="no"), TypeError, "is_neox must be True or False, got 'no'"),
    (dict(eps=float("inf")), ValueError, "eps must be a finite number above 0, got inf"),
])
def test_bad_scalars_are_qk_norm_rope_s_errors(scalars, error, message):
    with pytest.raises(error, match=re.escape(message)):
        cutetune.qk_norm_rope_kv(*_inputs(), 1e4, **scalars)


class Attention(torch.nn.Module):
    def forward(self, positions, qkv, q_weight, k_weight, cache, slots, key_cache, value_cache,
                k_scale, v_scale):
        q, k, v = qkv.split((Q_HEADS, KV_HEADS, KV_HEADS), dim=1)
        cutetune.qk_norm_rope_kv(positions, q, k, v, q_weight, k_weight, cache, slots,
                                 key_cache, value_cache, k_scale, v_scale, 1e4)
        return qkv * 2


def test_traces_as_the_custom_op_writing_q_k_and_the_caches():
    positions, q, _, _, q_weight, k_weight, cache, slots, key_cache, value_cache, k_scale, \
        v_scale = _inputs(FP8)
    exported = torch.export.export(Attention(), (positions, q._base, q_weight, k_weight, cache,
                                                 slots, key_cache, value_cache, k_scale,
                                                 v_scale))
    names = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert any("cutetune.qk_norm_rope_kv" in name for name in names), names
    schema = torch.ops.cutetune.qk_norm_rope_kv.default._schema
    written = {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write}
    assert written == {"q", "k", "key_cache", "value_cache"}

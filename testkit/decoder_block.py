"""A decoder block's worth of the public ops (qk_norm, fused_add_rmsnorm, silu_and_mul,
moe_dispatch, moe_combine) as one torch module, and CPU inputs for it: traced on the CPU
(tests/ops/test_custom_ops.py) and compiled and replayed on the GPU
(tests/gpu/test_custom_ops_gpu.py)."""

from __future__ import annotations

import torch

import cutetune

T, H, HEADS, KV_HEADS, D, INTER, E, K = 6, 256, 4, 2, 64, 512, 8, 2


class DecoderBlock(torch.nn.Module):
    def forward(self, qkv, q_weight, k_weight, h, residual, norm_weight, gate_up, topk_ids,
                topk_weights):
        q = qkv[:, :HEADS * D].view(-1, HEADS, D)
        k = qkv[:, HEADS * D:(HEADS + KV_HEADS) * D].view(-1, KV_HEADS, D)
        cutetune.qk_norm(q, k, q_weight, k_weight, eps=1e-6)
        normed, residual = cutetune.fused_add_rmsnorm(h, residual, norm_weight, eps=1e-6)
        act = cutetune.silu_and_mul(gate_up)
        routed = cutetune.moe_dispatch(normed, topk_ids, E, pad=16)
        expert_out = routed.dispatched * 2
        out = cutetune.moe_combine(expert_out, routed.row_of, topk_weights, experts=E, pad=16)
        return qkv, normed, residual, act, routed.counts, routed.offsets, out


def inputs():
    bf16 = torch.bfloat16
    return (torch.randn(T, (HEADS + 2 * KV_HEADS) * D, dtype=bf16), torch.ones(D, dtype=bf16),
            torch.ones(D, dtype=bf16), torch.randn(T, H, dtype=bf16),
            torch.randn(T, H, dtype=bf16), torch.ones(H, dtype=bf16),
            torch.randn(T, 2 * INTER, dtype=bf16), torch.zeros(T, K, dtype=torch.int32),
            torch.rand(T, K))

"""The public ops are torch.library custom ops under torch.compile: a decoder block calling
qk_norm, fused_add_rmsnorm, silu_and_mul, moe_dispatch and moe_combine traces as one graph, the
ops' fake implementations giving every shape (checked on the CPU: the graph is traced, not
run)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import cutetune
from cutetune.ops.moe_dispatch import DispatchResult
from testkit.decoder_block import HEADS, INTER, KV_HEADS, D, DecoderBlock, E, H, K, T, inputs
from testkit.op_problems import call_problems, public_call


def test_a_decoder_block_traces_as_one_graph_of_cutetune_ops():
    exported = torch.export.export(DecoderBlock(), inputs())
    called = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    names = {str(target) for target in called}
    for op in ("qk_norm", "rmsnorm", "silu_and_mul", "moe_dispatch", "moe_combine"):
        assert any(f"cutetune.{op}" in name for name in names), (op, names)
    shapes = [tuple(node.meta["val"].shape) for node in exported.graph.output_node().args[0]]
    capacity = T * K + E * 15
    assert shapes == [(T, (HEADS + 2 * KV_HEADS) * D), (T, H), (T, H), (T, INTER), (E,), (E + 1,),
                      (T, H)]
    dispatched = next(node for node in exported.graph.nodes
                      if "moe_dispatch" in str(node.target))
    assert tuple(dispatched.meta["val"][0].shape) == (capacity, H)


class DispatchInto(torch.nn.Module):
    def forward(self, x, topk_ids, dispatched, counts, offsets, row_of, error):
        out = DispatchResult(dispatched, counts, offsets, row_of, error)
        routed = cutetune.moe_dispatch(x, topk_ids, E, pad=16, out=out)
        return routed.dispatched * 2


def test_moe_dispatch_into_given_buffers_traces_as_the_mutating_custom_op():
    x, topk_ids = torch.randn(T, H, dtype=torch.bfloat16), torch.randint(0, E, (T, K)).int()
    buffers = vars(cutetune.moe_dispatch_buffers(x, topk_ids, E, pad=16))
    exported = torch.export.export(DispatchInto(), (x, topk_ids, *buffers.values()))
    names = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert any("cutetune.moe_dispatch_into" in name for name in names), names
    schema = torch.ops.cutetune.moe_dispatch_into.default._schema
    written = {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write}
    assert written == set(buffers)
    eager = {name: t.clone() for name, t in buffers.items()}
    DispatchInto()(x, topk_ids, *eager.values())
    exported.module()(x, topk_ids, *buffers.values())
    for name in ("counts", "offsets", "row_of", "error"):
        assert torch.equal(buffers[name], eager[name]), name


class Dispatched(TorchDispatchMode):
    """Records the namespace of every op torch dispatches meanwhile."""

    def __init__(self):
        super().__init__()
        self.namespaces = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.namespaces.add(func.namespace)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("op", sorted(call_problems()))
def test_eager_calls_do_not_go_through_the_custom_op(op):
    """Eager mode calls the kernel path directly (the custom op's dispatch costs host time):
    an eager call of each op (on the CPU, with the kernel's reference) dispatches no cutetune
    op."""
    call = public_call(op, 3)
    with Dispatched() as dispatched:
        call()
    assert "cutetune" not in dispatched.namespaces

"""Where split dispatch spends its time at prefill sizes, on cold input sets (timed as
`cutetune bench` times, a CUDA graph over rotated sets): for each config, the op; its routing
kernel alone; its copy kernel alone (row_of from a full call, launched without PDL); and the
two launched as the op launches them with the routing kernel cooperative or not and the copy
kernel a programmatic dependent launch or not. Beside them: a copy of the same bytes and a
write of the bytes dispatch writes. Prints whether the rows of the non-cooperative variant are
right (every pair's row holds its token).

    python3 benchmarks/moe_dispatch_parts.py mixtral-8x7b 4096 [--compile-only]
"""

from __future__ import annotations

import sys

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from cutetune.kernels import moe_dispatch as md
from cutetune.kernels.dtypes import DTYPE_BYTES, vector_elements
from cutetune.spaces.models import PRESETS

CONFIGS = [md.MoEDispatchConfig(md.SPLIT, 128, 8, 128, 1),
           md.MoEDispatchConfig(md.SPLIT, 128, 8, 128, 4),
           md.MoEDispatchConfig(md.SPLIT, 128, 4, 128, 2),
           md.MoEDispatchConfig(md.SPLIT_BULK, 128, 8, 128, 1),
           md.MoEDispatchConfig(md.SPLIT_BULK, 32, 8, 128, 1),
           md.MoEDispatchConfig(md.SPLIT_BULK, 128, 8, 128, 2)]


@cute.jit
def _parts(mX, mIds, mRowOf, mDisp, mCounts, mOffsets, mError, mWs, stream: cuda.CUstream,
           K: cutlass.Constexpr[int], E: cutlass.Constexpr[int], L: cutlass.Constexpr[int],
           PAD: cutlass.Constexpr[int], VEC: cutlass.Constexpr[int],
           THREADS: cutlass.Constexpr[int], GRID: cutlass.Constexpr[int],
           TPB: cutlass.Constexpr[int], BULK: cutlass.Constexpr[bool],
           ROUTE: cutlass.Constexpr[bool], COOP: cutlass.Constexpr[bool],
           COPY: cutlass.Constexpr[bool], PDL: cutlass.Constexpr[bool],
           HINTS: cutlass.Constexpr[str]):
    """The routing kernel (ROUTE; cooperative or not), then the copy kernel (COPY; the bulk one
    with BULK; a programmatic dependent launch or not), each launched as the op launches it."""
    V = cute.size(mX, mode=[1]) // VEC
    slices = (V + THREADS - 1) // THREADS
    tokens = cute.size(mX, mode=[0])
    if cutlass.const_expr(ROUTE):
        md._route_kernel(mIds, mRowOf, mDisp, mCounts, mOffsets, mError, mWs, K, E, 0, L, PAD,
                         False, VEC, V, THREADS, slices, GRID).launch(
            grid=(GRID, 1, 1), block=(THREADS, 1, 1), stream=stream, cooperative=COOP)
    if cutlass.const_expr(COPY and BULK):
        md._bulk_copy_kernel(mX, mRowOf, mDisp, K, TPB).launch(
            grid=(md._copy_unit_total(tokens, TPB, 1), 1, 1), block=(md.BULK_COPY_THREADS, 1, 1),
            stream=stream, use_pdl=PDL)
    if cutlass.const_expr(COPY and not BULK):
        units = md._copy_unit_total(tokens, TPB, slices)
        md._copy_kernel(mX, mRowOf, mDisp, K, VEC, V, THREADS, TPB, slices, HINTS).launch(
            grid=(units, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=PDL)


def compile_parts(problem: md.MoEProblem, config: md.MoEDispatchConfig):
    vec = vector_elements(problem.dtype, 128)
    fake = md.FakeArguments(problem, vec)
    L = problem.local_experts
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)

    def parts(route: bool, coop: bool, copy: bool, pdl: bool):
        return cute.compile(
            _parts, *fake.op_tensors(), stream, problem.top_k,
            problem.experts, L, problem.pad, vec, config.warps_per_block * 32,
            config.grid_blocks, config.tokens_per_block, config.policy == md.SPLIT_BULK, route,
            coop, copy, pdl, config.cache_hints, options="--enable-tvm-ffi")

    routing = parts(route=True, coop=True, copy=False, pdl=False)
    copy = parts(route=False, coop=False, copy=True, pdl=False)
    variants = {(coop, pdl): parts(route=True, coop=coop, copy=True, pdl=pdl)
                for coop in (True, False) for pdl in (True, False)}
    return routing, copy, variants


def cold_input_sets(problem: md.MoEProblem, config: md.MoEDispatchConfig):
    """The visible GPU's spec, the bytes a call of `config` moves, and input sets (seed 0)
    enough that a rotation over them exceeds 3x the L2, as `cutetune bench` rotates them."""
    from cutetune.tuner.measure import input_sets_for
    from cutetune.tuner.roofline import device_spec_for

    spec = device_spec_for(torch.cuda.get_device_name())
    nbytes = md.cost(problem, config, spec).bytes_moved
    generator = torch.Generator(device="cuda").manual_seed(0)
    return spec, nbytes, [md.make_inputs(problem, "cuda", generator)
                          for _ in range(input_sets_for(nbytes, spec.l2_bytes))]


def op_args(t) -> tuple:
    """An input set's tensors in the order the op and its parts take them."""
    return (t["x"], t["topk_ids"], t["row_of"], t["dispatched"], t["counts"], t["offsets"],
            t["error"], t["workspace"])


def main() -> None:
    model, tokens = sys.argv[1], int(sys.argv[2])
    (static,) = md.KERNEL.problems_for_model(PRESETS[model], "bfloat16")
    problem = static.with_tokens(tokens)
    compiled = {c: (md.KERNEL.compile(problem, c), *compile_parts(problem, c)) for c in CONFIGS}
    if "--compile-only" in sys.argv:
        print("compiled", len(compiled))
        return
    from cutetune.tuner.ceilings import time_copy_of
    from cutetune.tuner.measure import time_in_graph

    spec, nbytes, sets = cold_input_sets(problem, CONFIGS[0])
    written = problem.num_tokens * problem.top_k * problem.hidden * DTYPE_BYTES[problem.dtype]
    writes = [torch.empty(written // 4, dtype=torch.int32, device="cuda") for _ in range(2)]
    print(f"{model}, {tokens} tokens, {len(sets)} input sets, {nbytes / 1e6:.1f} MB:")
    print(f"  copy of the same bytes      {time_copy_of(nbytes, spec.l2_bytes).median_us:8.2f} us")
    write_us = time_in_graph([lambda b=b: b.zero_() for b in writes]).median_us
    print(f"  write of the written bytes  {write_us:8.2f} us")

    for c, (op, routing, copy, variants) in compiled.items():
        for t in sets:
            md.launch(op, t)
        torch.cuda.synchronize()
        op_us = time_in_graph([lambda t=t, op=op: md.launch(op, t) for t in sets]).median_us
        routing_us = time_in_graph([lambda t=t, r=routing: r(*op_args(t))
                                    for t in sets]).median_us
        copy_us = time_in_graph([lambda t=t, c=copy: c(*op_args(t)) for t in sets]).median_us
        variant_us = {
            f"coop={int(coop)} pdl={int(pdl)}":
                time_in_graph([lambda t=t, v=v: v(*op_args(t)) for t in sets]).median_us
            for (coop, pdl), v in variants.items()}
        t = sets[0]
        variants[(False, True)](*op_args(t))
        torch.cuda.synchronize()
        rows = t["dispatched"][t["row_of"].view(-1).long()].view(problem.num_tokens,
                                                                 problem.top_k, -1)
        right = torch.equal(rows, t["x"].unsqueeze(1).expand(-1, problem.top_k, -1))
        print(f"  {c.policy:10s} {c.grid_blocks}x{c.warps_per_block}w t{c.tokens_per_block}: "
              f"op {op_us:7.2f}  routing alone {routing_us:6.2f}  copy alone {copy_us:7.2f} us; "
              + ", ".join(f"{k} {x:.2f}" for k, x in variant_us.items())
              + f"; noncoop rows ok={right}", flush=True)


if __name__ == "__main__":
    main()

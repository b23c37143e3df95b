"""The CI compile checks of moe_combine: the covering points (every pair of knob values, and the
defaults served at every bucket) compile for sm_90a on the CPU for the MoE problem of every
preset with routed experts (bf16, the dtype those models ship in) and for a synthetic fp16
problem whose hidden size only 32-bit vectors divide; the PTX shows 128-bit accesses to the
expert rows and to out, every pair's load issued before the first multiply-add, and one block
barrier.

About 60 compiles at 0.5-0.8 s each (nearly every valid point: the space is small); the `sweep`
marker compiles every valid point.
"""

import re
from collections import Counter

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.moe_combine import (
    KERNEL,
    MAX_BYTES_IN_FLIGHT,
    CombineConfig,
    vector_bits,
)
from cutetune.kernels.moe_common import MoEProblem
from cutetune.spaces.buckets import BUCKETS
from cutetune.spaces.models import PRESETS
from testkit.compile_checks import GLOBAL_ACCESS, assert_points_compile, preset_params, ptx_of
from testkit.covering_points import covering_configs

H200 = DEVICE_SPECS["H200"]


PRESET_PROBLEMS = preset_params(KERNEL, lambda problem: f"H{problem.hidden}-K{problem.top_k}")
# fp16 with 1002 = 501 x 2: only 32-bit vectors divide it (and no split does); top-k 4.
SYNTHETIC = [pytest.param(MoEProblem(num_tokens=1, dtype="float16", hidden=1002, experts=60,
                                     top_k=4, pad=16, expert_begin=0, expert_end=60),
                          id="synthetic-float16-H1002-K4")]


def test_sweep_covers_every_moe_preset():
    # Guards the sweep against silently shrinking (e.g. a preset losing its experts).
    swept = {p.values[0] for p in PRESET_PROBLEMS}
    for model in PRESETS.values():
        if model.num_experts:
            assert set(KERNEL.problems_for_model(model, "bfloat16")) <= swept


@pytest.mark.parametrize("problem", PRESET_PROBLEMS + SYNTHETIC)
def test_covering_points_compile(problem):
    assert_points_compile(KERNEL, problem, covering_configs(KERNEL, problem, H200, BUCKETS))


@pytest.mark.sweep
@pytest.mark.parametrize("problem", PRESET_PROBLEMS + SYNTHETIC)
def test_every_valid_point_compiles(problem):
    valid = KERNEL.space.enumerate(problem, H200).valid
    assert valid, f"no valid point for {problem.describe()}"
    assert_points_compile(KERNEL, problem, valid)


# ---------------------------------------------------------------------------------------------
# PTX





def _problem(dtype: str, hidden: int, top_k: int) -> MoEProblem:
    return MoEProblem(num_tokens=1, dtype=dtype, hidden=hidden, experts=64, top_k=top_k,
                      pad=16, expert_begin=0, expert_end=64)


PTX_CASES = [
    # dtype, hidden, top_k, config; each thread makes exactly one pass over its slice, so
    # the loop body appears once.
    ("bfloat16", 2048, 8, CombineConfig(1, 1, 8)),   # 256 vectors, 256 threads
    ("bfloat16", 4096, 2, CombineConfig(16, 1, 1)),  # decode: 16 slices of 32
    ("bfloat16", 7168, 8, CombineConfig(2, 1, 8)),   # 448 vectors, 2 passes, ragged
    ("float16", 2048, 4, CombineConfig(1, 4, 4)),    # 4 tokens of 32 threads, 2 passes
    ("float16", 1002, 4, CombineConfig(1, 2, 8)),     # 32-bit only: 501 of 128 threads
    ("bfloat16", 1024, 12, CombineConfig(1, 1, 4)),  # top-k 12: batches of 8 and 4
]


@pytest.mark.parametrize(("dtype", "hidden", "top_k", "config"), PTX_CASES,
                         ids=[f"{d}-H{h}-K{k}-s{c.hidden_split}-"
                              f"t{c.tokens_per_block}-w{c.warps_per_block}"
                              for d, h, k, c in PTX_CASES])
def test_ptx_vector_width_and_load_order(dtype, hidden, top_k, config, tmp_path, monkeypatch):
    ptx = ptx_of(KERNEL, _problem(dtype, hidden, top_k), config, H200, tmp_path, monkeypatch)
    bits = vector_bits(_problem(dtype, hidden, top_k))
    accesses = GLOBAL_ACCESS.findall(ptx)
    assert len(accesses) == ptx.count("ld.global") + ptx.count("st.global") > 0
    widths = Counter((op, int(lanes or 1) * int(b)) for op, lanes, b in accesses)
    # The staging of row_of and the weights: two 32-bit loads per pair a thread stages (one
    # round of a block's threads at most here).
    staging = 2
    # Per pass of a thread (the loop body may be unrolled into several copies): one vector
    # load per pair from the expert rows, one vector store to out, nothing narrower or wider.
    passes = widths[("st", bits)]
    assert passes >= 1
    if bits == 32:
        assert widths == {("ld", 32): staging + top_k * passes, ("st", 32): passes}
    else:
        assert widths == {("ld", 32): staging, ("ld", bits): top_k * passes,
                          ("st", bits): passes}
    if bits == 128:
        assert re.search(r"\bld\.global(\.nc)?\.v4\.[bf]32\b", ptx)
        assert re.search(r"\bst\.global\.v4\.[bf]32\b", ptx)

    # One barrier: the staging's loads before it, the expert rows' after it.
    assert len(re.findall(r"\bbar\.sync\b", ptx)) == 1
    staged, body = ptx.split("bar.sync")
    assert staged.count("ld.global") == staging
    # Each batch's loads (all top_k of them, or 8 and then the rest at 128 bits) come before
    # its first fused multiply-add: one memory round trip per batch, not per pair.
    batch = min(top_k, MAX_BYTES_IN_FLIGHT // (bits // 8))
    first_pass = body[: body.index("st.global")]
    row_load = r"ld\.global(?:\.nc)?(?:\.v\d)?\.b\d+"
    loads = [m.start() for m in re.finditer(row_load, first_pass)]
    assert len(loads) == top_k
    first_fma = first_pass.index("fma.rn.f32")
    assert loads[batch - 1] < first_fma
    assert all(first_fma < position for position in loads[batch:])

"""The CI compile checks: the covering points of the rmsnorm space (every pair of knob values,
and the defaults served at every bucket) compile for sm_90a on the CPU, for every problem of
every public preset (in bf16, the dtype those models ship in; a problem two presets share
compiles once) and for synthetic problems covering the other dtypes, an output dtype different
from the input's, Gemma-style weight bias, hidden sizes that are not powers of two and both
ends of the hidden range; and the PTX of a few points shows the access
width, the shuffle tree, the single barrier and the cache hints the config asks for.

About 390 compiles at 0.3-1 s each; the `sweep` marker compiles every valid point (about
1100: every point with each of the three cache hints), one test id per problem and cache hint.
"""

import re
from collections import Counter

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.device.cache_hints import L2_EVICT_LAST_POLICY
from cutetune.kernels.rmsnorm import (
    BLOCK_PER_ROW,
    CACHE_HINTS,
    KERNEL,
    WARP_PER_ROW,
    RMSNormConfig,
    RMSNormProblem,
)
from cutetune.spaces.buckets import BUCKETS
from cutetune.spaces.models import PRESETS
from testkit.compile_checks import GLOBAL_ACCESS, assert_points_compile, preset_params, ptx_of
from testkit.covering_points import covering_configs

H200 = DEVICE_SPECS["H200"]


def _synthetic(dtype: str, hidden: int, out_dtype: str | None = None, fused_add: bool = False,
               weight_bias: float = 1.0) -> object:
    problem = RMSNormProblem(num_tokens=1, dtype=dtype, out_dtype=out_dtype or dtype,
                             hidden=hidden, eps=1e-5, weight_bias=weight_bias,
                             fused_add=fused_add)
    form = "fused" if fused_add else "plain"
    return pytest.param(problem, id=f"{dtype}-to-{problem.out_dtype}-{hidden}-{form}-bias"
                                    f"{weight_bias:g}")


SYNTHETIC_PARAMS = [
    _synthetic("float16", 2880, fused_add=True),
    _synthetic("float32", 5376, fused_add=True),
    _synthetic("float32", 1024),
    _synthetic("bfloat16", 2048, out_dtype="float32", fused_add=True),
    _synthetic("float32", 7168, out_dtype="bfloat16"),
    _synthetic("bfloat16", 256),
    _synthetic("bfloat16", 16384, fused_add=True),
    _synthetic("float16", 2882),  # only 32-bit vectors divide it
]
PRESET_PARAMS = preset_params(
    KERNEL, lambda problem: f"{problem.hidden}-{'fused' if problem.fused_add else 'plain'}")


def test_sweep_covers_every_preset_problem():
    # Guards the sweep against silently shrinking: every static problem of every preset is
    # compiled under one id or another.
    covered = {p.values[0].static_key() for p in PRESET_PARAMS}
    for model in PRESETS.values():
        for problem in KERNEL.problems_for_model(model, "bfloat16"):
            assert problem.static_key() in covered


@pytest.mark.parametrize("problem", PRESET_PARAMS + SYNTHETIC_PARAMS)
def test_covering_points_compile(problem):
    assert_points_compile(KERNEL, problem, covering_configs(KERNEL, problem, H200, BUCKETS))


# One test id per problem and cache-hint third of the space, so that `pytest -n 2` balances.
@pytest.mark.sweep
@pytest.mark.parametrize("hints", CACHE_HINTS)
@pytest.mark.parametrize("problem", PRESET_PARAMS + SYNTHETIC_PARAMS)
def test_every_valid_point_compiles(problem, hints):
    valid = [c for c in KERNEL.space.enumerate(problem, H200).valid if c.cache_hints == hints]
    assert valid, f"no valid {hints} point for {problem.describe()}"
    assert_points_compile(KERNEL, problem, valid)


# ---------------------------------------------------------------------------------------------
# PTX





def _widths(ptx: str) -> Counter:
    accesses = GLOBAL_ACCESS.findall(ptx)
    assert len(accesses) == ptx.count("ld.global") + ptx.count("st.global") > 0
    return Counter((op, int(lanes or 1) * int(bits)) for op, lanes, bits in accesses)


PTX_CASES = [
    # dtype, out_dtype, hidden, fused, form, vector_bits, warps, loads, stores (bits: count)
    # bf16 4096 over 4 warps: 4 vectors per thread of x and the weight, 4 stores.
    ("bfloat16", "bfloat16", 4096, False, BLOCK_PER_ROW, 128, 4, {128: 8}, {128: 4}),
    # Fused: the residual too is loaded and stored.
    ("bfloat16", "bfloat16", 4096, True, BLOCK_PER_ROW, 128, 4, {128: 12}, {128: 8}),
    # 2880 over 4 warps: 3 slots, the last predicated (loads clamped, so still 3 each).
    ("bfloat16", "bfloat16", 2880, True, BLOCK_PER_ROW, 128, 4, {128: 9}, {128: 6}),
    # bf16 in, fp32 out: 64-bit loads of 4 elements, 128-bit stores of them.
    ("bfloat16", "float32", 4096, False, BLOCK_PER_ROW, 128, 8, {64: 8}, {128: 4}),
    # fp32 in, bf16 out: 128-bit loads, 64-bit stores.
    ("float32", "bfloat16", 1024, False, WARP_PER_ROW, 128, 2, {128: 16}, {64: 8}),
    ("float32", "float32", 512, True, WARP_PER_ROW, 64, 4, {64: 24}, {64: 16}),
    ("float16", "float16", 1024, False, WARP_PER_ROW, 32, 1, {32: 32}, {32: 16}),
]


@pytest.mark.parametrize(
    ("dtype", "out_dtype", "hidden", "fused", "form", "vector_bits", "warps", "loads", "stores"),
    PTX_CASES,
    ids=[f"{d}-{o}-{h}-{'fused' if f else 'plain'}-{form}-v{v}-w{w}"
         for d, o, h, f, form, v, w, _, _ in PTX_CASES])
def test_ptx_access_widths_shuffles_and_barrier(dtype, out_dtype, hidden, fused, form,
                                                vector_bits, warps, loads, stores, tmp_path,
                                                monkeypatch):
    problem = RMSNormProblem(num_tokens=1, dtype=dtype, out_dtype=out_dtype, hidden=hidden,
                             eps=1e-6, weight_bias=0.0, fused_add=fused)
    config = RMSNormConfig(form, vector_bits, warps)
    ptx = ptx_of(KERNEL, problem, config, H200, tmp_path, monkeypatch)

    # Every global load and store is exactly one vector of the configured width: nothing
    # split into narrower accesses, nothing wider than the config allows.
    widths = _widths(ptx)
    assert widths == Counter({("ld", b): n for b, n in loads.items()}
                             | {("st", b): n for b, n in stores.items()}), widths

    shuffles = [int(m) for m in re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, (\d+),",
                                           ptx)]
    block_warps = warps if form == BLOCK_PER_ROW else 1
    # Five rounds within each warp, then log2(warps) across the row's warps.
    expected = [16, 8, 4, 2, 1] + [block_warps >> (i + 1)
                                   for i in range(block_warps.bit_length() - 1)]
    assert shuffles == expected
    barriers = re.findall(r"\bbar(?:rier)?\.(?:sync|cta\.sync)\b", ptx)
    assert len(barriers) == (1 if block_warps > 1 else 0)
    assert ("st.shared" in ptx) == (block_warps > 1)


def test_ptx_streaming_hints_on_rows_not_on_the_weight(tmp_path, monkeypatch):
    problem = RMSNormProblem(num_tokens=1, dtype="bfloat16", out_dtype="bfloat16",
                             hidden=4096, eps=1e-6, weight_bias=0.0, fused_add=True)
    config = RMSNormConfig(BLOCK_PER_ROW, 128, 4, "streaming")
    ptx = ptx_of(KERNEL, problem, config, H200, tmp_path, monkeypatch)
    # 4 slots a thread: x and the residual loaded with .cs, the weight (read again by every
    # row) with plain loads; the residual and out stored with .cs.
    assert len(re.findall(r"\bld\.global\.cs\.v4\.", ptx)) == 8
    assert len(re.findall(r"\bld\.global(\.nc)?\.v4\.", ptx)) == 4
    assert len(re.findall(r"\bst\.global\.cs\.v4\.", ptx)) == 8
    assert not re.search(r"\bst\.global\.v4\.", ptx)


def test_ptx_evict_last_loads_on_rows_not_on_the_weight(tmp_path, monkeypatch):
    problem = RMSNormProblem(num_tokens=1, dtype="bfloat16", out_dtype="bfloat16",
                             hidden=4096, eps=1e-6, weight_bias=0.0, fused_add=True)
    config = RMSNormConfig(BLOCK_PER_ROW, 128, 4, "evict_last_loads")
    ptx = ptx_of(KERNEL, problem, config, H200, tmp_path, monkeypatch)
    # 4 slots a thread: x and the residual loaded under L1 and L2 evict_last policies (the
    # policy register holds the L2 evict_last constant); the weight and every store plain.
    hinted = re.findall(r"\bld\.global\.L1::evict_last\.L2::cache_hint\.v4\.b32 .*, (%rd\d+);",
                        ptx)
    assert len(hinted) == 8
    assert len(re.findall(r"\bld\.global(\.nc)?\.v4\.", ptx)) == 4
    assert len(re.findall(r"\bst\.global\.v4\.", ptx)) == 8
    for policy in set(hinted):
        assert re.search(rf"mov\.b64\s+{re.escape(policy)}, {L2_EVICT_LAST_POLICY};", ptx)


def test_ptx_128_bit_config_uses_v4_accesses(tmp_path, monkeypatch):
    problem = RMSNormProblem(num_tokens=1, dtype="bfloat16", out_dtype="bfloat16",
                             hidden=7168, eps=1e-6, weight_bias=1.0, fused_add=True)
    ptx = ptx_of(KERNEL, problem, RMSNormConfig(BLOCK_PER_ROW, 128, 8), H200, tmp_path, monkeypatch)
    assert re.search(r"ld\.global(\.nc)?\.v4\.(b|u|f)32", ptx)
    assert re.search(r"st\.global\.v4\.(b|u|f)32", ptx)
    # 896 vectors over 256 threads: 4 slots, x, residual and weight loaded in each; every
    # load is issued before the first store (one memory round trip, not one per slot).
    lines = [line for line in ptx.splitlines() if ".global" in line]
    first_store = next(i for i, line in enumerate(lines) if "st.global" in line)
    assert sum("ld.global" in line for line in lines[:first_store]) == 12
    assert not any("ld.global" in line for line in lines[first_store:])

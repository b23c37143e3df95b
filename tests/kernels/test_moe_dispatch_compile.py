"""The CI compile sweep of moe_dispatch: every valid point compiles for sm_90a on the CPU for the
MoE problem of every preset with routed experts (bf16) and for a synthetic fp16 problem with a
local expert range, pad 1 and a hidden size only 64-bit vectors divide (at 4 tokens, so that
every tokens_per_block is valid too: 2 and 4 in each of its forms, 3 in split_block_ranks); the
PTX shows the grid barrier's gpu-scope release arrival and acquire spin, the replicated form's
barrier-free ranking, zero stores only where padding is zeroed, copies of whole 128-bit vectors,
split_bulk's rows moved by bulk copies through shared memory, the published count exchange of
few experts, streaming copies, and split_block_ranks' routing with no barrier and no global
atomic.

By default the covering points compile (every pair of knob values, and the defaults served at
every bucket: about 80); the `sweep` marker compiles every valid point (about 310 at about a
second of CPU each).
"""

import dataclasses
import re
from collections import Counter

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels import moe_dispatch as md
from cutetune.kernels.moe_common import MoEProblem
from cutetune.kernels.moe_dispatch import KERNEL
from cutetune.kernels.moe_dispatch import common as mdc
from cutetune.kernels.moe_dispatch.common import FormConfig
from cutetune.spaces.buckets import BUCKETS
from testkit.compile_checks import (
    GLOBAL_ACCESS,
    assert_points_compile,
    preset_params,
    presets_of,
    ptx_of,
)
from testkit.covering_points import covering_configs
from testkit.moe_dispatch_points import point

H200 = DEVICE_SPECS["H200"]
PRESET_PARAMS = preset_params(KERNEL)
SYNTHETIC = MoEProblem(num_tokens=4, dtype="float16", hidden=1004, experts=20, top_k=3, pad=1,
                       expert_begin=5, expert_end=17)


def test_sweep_covers_every_moe_preset():
    # Guards the sweep against silently shrinking (e.g. a preset losing its experts).
    assert presets_of(KERNEL) == {"qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3",
                                  "mixtral-8x7b"}


def test_the_synthetic_problem_reaches_each_forms_batches_and_narrow_vectors():
    synthetic = KERNEL.space.enumerate(SYNTHETIC, H200).valid
    assert {c.tokens_per_block for c in synthetic} == {1, 2, 3, 4}
    assert {c.form for c in synthetic if c.tokens_per_block == 3} == {mdc.SPLIT_BLOCK_RANKS}
    assert mdc.vector_bits(SYNTHETIC) == 64
    # 1004 fp16 elements are 2008 bytes, not a whole number of bulk copies.
    assert {c.form for c in synthetic} == {mdc.FUSED, mdc.REPLICATED, mdc.SPLIT,
                                             mdc.SPLIT_BLOCK_RANKS}


@pytest.mark.parametrize("problem", PRESET_PARAMS + [pytest.param(SYNTHETIC, id="synthetic")])
def test_covering_points_compile(problem):
    assert_points_compile(KERNEL, problem, covering_configs(KERNEL, problem, H200, BUCKETS))


@pytest.mark.sweep
@pytest.mark.parametrize("problem", PRESET_PARAMS + [pytest.param(SYNTHETIC, id="synthetic")])
def test_every_valid_point_compiles(problem):
    valid = KERNEL.space.enumerate(problem, H200).valid
    assert valid, f"no valid point for {problem.describe()}"
    assert_points_compile(KERNEL, problem, valid)


# ---------------------------------------------------------------------------------------------
# PTX

# The barrier: a gpu-scope release add to arrive (atom's default scope is gpu, so .gpu may be
# left out) and a gpu-scope acquire load to spin.
RELEASE_ARRIVAL = re.compile(r"\batom(?:\.global)?\.release(?:\.gpu)?(?:\.global)?\.add\.[us]32\b")
ACQUIRE_SPIN = re.compile(r"\bld\.acquire\.gpu(?:\.global)?\.[bsu]32\b")
ZERO_STORE = re.compile(r"\bst\.global\.v4\.b32\s+\[[^\]]+\],\s*\{0, 0, 0, 0\}")


def _ptx_entries(problem: MoEProblem, config: FormConfig, tmp_path,
                 monkeypatch) -> dict[str, str]:
    """The PTX of each kernel the point launches, by kernel name (fused, route, copy)."""
    ptx = ptx_of(KERNEL, problem, config, H200, tmp_path, monkeypatch)
    entries = {}
    for chunk in ptx.split(".visible .entry ")[1:]:
        name = re.match(r"kernel_cutlass_(\w+?)_kernel_", chunk).group(1)
        entries[name] = chunk
    return entries


def _widths(ptx: str) -> Counter:
    return Counter((op, int(lanes or 1) * int(bits))
                   for op, lanes, bits in GLOBAL_ACCESS.findall(ptx))


def _assert_barrier(ptx: str) -> None:
    assert len(RELEASE_ARRIVAL.findall(ptx)) == 1, "one release arrival on the barrier word"
    assert ACQUIRE_SPIN.search(ptx), "the spin must load the barrier word with acquire"
    # Nothing else in the kernel is a strong global atomic or acquire load than the barrier's.
    assert "atom.global.acq" not in ptx and "atom.global.relaxed" not in ptx


QWEN3_30B = MoEProblem(num_tokens=64, dtype="bfloat16", hidden=2048, experts=128, top_k=8,
                       pad=16, expert_begin=0, expert_end=128, zero_padding=True)


@pytest.mark.parametrize("tokens_per_block", [1, 2])
def test_ptx_fused_barrier_and_128_bit_copies(tokens_per_block, tmp_path, monkeypatch):
    config = point(mdc.FUSED, 128, 4, tokens_per_block)
    entries = _ptx_entries(QWEN3_30B, config, tmp_path, monkeypatch)
    assert set(entries) == {"fused"}
    ptx = entries["fused"]
    assert ".reqntid 128, 1, 1" in ptx  # the block size bounds the registers (residency)
    _assert_barrier(ptx)
    # Block 0 counts in shared memory.
    assert re.search(r"\batom\.shared(\.cta)?\.add\.[us]32\b", ptx)
    widths = _widths(ptx)
    # The hidden states move only as 128-bit vectors: one load per token of the unit, a
    # store per (token, k), and zero stores for the padding; everything else is 32-bit
    # routing data.
    assert set(widths) <= {("ld", 128), ("st", 128), ("ld", 32), ("st", 32)}, widths
    assert widths[("ld", 128)] == tokens_per_block
    zero_stores = len(ZERO_STORE.findall(ptx))
    assert zero_stores >= 1
    assert widths[("st", 128)] == tokens_per_block * 8 + zero_stores
    # The barrier comes before the first copy.
    assert ptx.index("ld.acquire.gpu") < ptx.index("ld.global.v4")
    # Block 0 loads its threads' first ids before it clears its counters and waits.
    assert len(GLOBAL_ACCESS.findall(ptx[:ptx.index("bar.sync")])) == mdc.IDS_IN_FLIGHT


def _route_and_copy_ptx(config: FormConfig, copy_name: str, tmp_path,
                        monkeypatch) -> tuple[str, str]:
    """A split form's two kernels: the routing kernel (checked for its grid barrier) and the
    copy kernel `copy_name`."""
    entries = _ptx_entries(QWEN3_30B, config, tmp_path, monkeypatch)
    assert set(entries) == {"route", copy_name}
    _assert_barrier(entries["route"])
    return entries["route"], entries[copy_name]


def test_ptx_split_route_and_copy_kernels(tmp_path, monkeypatch):
    route, copy = _route_and_copy_ptx(point(mdc.SPLIT, 128, 8, 4), "copy",
                                      tmp_path, monkeypatch)
    assert re.search(r"\batom\.shared(\.cta)?\.add\.[us]32\b", route)
    # Block counts are added to the global counters with (relaxed) atomics, and read back
    # after the barrier with gpu-scope loads.
    assert re.search(r"\batom\.global\.add\.[us]32\b", route)
    assert re.search(r"\bld\.relaxed\.gpu\.global\.b32\b", route)
    # A thread's first IDS_IN_FLIGHT ids are loaded before the epoch word (whose round trip
    # they overlap) and before the first block barrier; they and their slots stay in
    # registers until the rows are written, so they are loaded once in all (and the loop
    # over later batches loads ids and stored slots once each).
    first_barrier = route[:route.index("bar.sync")]
    assert (Counter(op for op, _, _ in GLOBAL_ACCESS.findall(first_barrier))["ld"]
            == mdc.IDS_IN_FLIGHT + 1)
    assert first_barrier.index("ld.global") < first_barrier.index("st.global")
    # The routing kernel touches hidden states only to zero padding rows.
    route_widths = _widths(route)
    assert ("ld", 128) not in route_widths
    assert route_widths[("st", 128)] == len(ZERO_STORE.findall(route)) >= 1
    # The copy kernel: no barrier, 4 tokens' 128-bit loads, then 4 x 8 128-bit stores.
    assert "atom" not in copy and "ld.acquire" not in copy
    copy_widths = _widths(copy)
    assert copy_widths[("ld", 128)] == 4 and copy_widths[("st", 128)] == 4 * 8
    assert not ZERO_STORE.search(copy)
    assert ".reqntid 256, 1, 1" in copy
    # Programmatic dependent launch: routing lets the copy kernel launch at once; the copy
    # kernel loads x first, then waits for routing to finish, then reads row_of.
    assert route.index("griddepcontrol.launch_dependents") < route.index("atom.shared")
    assert copy.count("griddepcontrol.wait") == 1
    wait = copy.index("griddepcontrol.wait")
    assert copy.index("ld.global.v4") < wait < copy.index("ld.global.b32")
    (tmp_path / "fused").mkdir()
    assert "griddepcontrol" not in _ptx_entries(QWEN3_30B, point(
        mdc.FUSED, 128, 8, 4), tmp_path / "fused", monkeypatch)["fused"]


MIXTRAL = MoEProblem(num_tokens=4096, dtype="bfloat16", hidden=4096, experts=8, top_k=2,
                     pad=16, expert_begin=0, expert_end=8)


def test_ptx_split_routing_publishes_few_experts_counts(tmp_path, monkeypatch):
    config = point(mdc.SPLIT, 8, 8, 1)
    assert mdc.publishes_counts(MIXTRAL.local_experts, config.grid_blocks)
    entries = _ptx_entries(MIXTRAL, config, tmp_path, monkeypatch)
    route = entries["route"]
    _assert_barrier(route)
    # The barrier's arrival is the only global atomic: the counts go out with plain stores
    # and come back, after the barrier, with gpu-scope loads.
    assert len(re.findall(r"\batom\.global\.", route)) == 1
    assert route.index("ld.acquire.gpu") < route.index("ld.relaxed.gpu.global.b32")
    # No epoch to read: only the thread's first ids are loaded before the first block barrier.
    first_barrier = route[:route.index("bar.sync")]
    assert Counter(op for op, _, _ in GLOBAL_ACCESS.findall(first_barrier))["ld"] == \
        mdc.IDS_IN_FLIGHT


@pytest.mark.parametrize("tokens_per_block", [2, md.space.BLOCK_RANKS_DEFAULT_TOKENS_PER_BLOCK])
def test_ptx_block_ranks_route_without_barrier_and_copy_resolves_rows(tokens_per_block, tmp_path,
                                                                       monkeypatch):
    problem = dataclasses.replace(MIXTRAL.with_tokens(tokens_per_block), zero_padding=True)
    config = point(mdc.SPLIT_BLOCK_RANKS, 8, 8, tokens_per_block, "streaming")
    KERNEL.space.check(problem, config, H200)
    entries = _ptx_entries(problem, config, tmp_path, monkeypatch)
    assert set(entries) == {"rank", "block_ranks_copy"}
    rank, copy = entries["rank"], entries["block_ranks_copy"]
    # Routing: shared-memory atomics only, no barrier, no global atomic, no x; it lets the
    # copy kernel launch at once.
    assert re.search(r"\batom\.shared(\.cta)?\.add\.[us]32\b", rank)
    assert "atom.global" not in rank and "ld.acquire" not in rank
    assert ("ld", 128) not in _widths(rank) and ("st", 128) not in _widths(rank)
    assert rank.index("griddepcontrol.launch_dependents") < rank.index("atom.shared")
    # The copy: the block's tokens' streaming loads before the wait, then gpu-scope loads of
    # the rank codes and the table, one gpu-scope store of a resolved row per pair lane, one
    # streaming store per token and k, and the padding's zero stores; no atomic.
    assert "atom" not in copy and "ld.acquire" not in copy
    assert copy.count("griddepcontrol.wait") == 1
    wait = copy.index("griddepcontrol.wait")
    assert copy.index("ld.global.cs.v4") < wait < copy.index("ld.relaxed.gpu.global.b32")
    assert len(re.findall(r"\bld\.global\.cs\.v4\.b32\b", copy)) == tokens_per_block
    assert len(re.findall(r"\bst\.global\.cs\.v4\.b32\b", copy)) == tokens_per_block * 2
    assert len(re.findall(r"\bst\.relaxed\.gpu\.global\.b32\b", copy)) == 1
    # One load per lane per 32 words of the table (8 blocks x 9 = 72 words: 3), plus the
    # group's 4 or 6 rank codes (one lane each).
    assert len(re.findall(r"\bld\.relaxed\.gpu\.global\.b32\b", copy)) == 3 + 1
    assert ZERO_STORE.search(copy)


def test_ptx_streaming_hints_reach_every_access_of_the_copy(tmp_path, monkeypatch):
    config = point(mdc.SPLIT, 128, 8, 2, "streaming")
    copy = _ptx_entries(QWEN3_30B, config, tmp_path, monkeypatch)["copy"]
    # 2 tokens' loads and 2 x 8 stores of 128 bits, all cache-streaming; nothing plain.
    assert len(re.findall(r"\bld\.global\.cs\.v4\.b32\b", copy)) == 2
    assert len(re.findall(r"\bst\.global\.cs\.v4\.b32\b", copy)) == 2 * 8
    assert not re.search(r"\b(ld|st)\.global\.v4\.", copy)
    (tmp_path / "normal").mkdir()
    normal = _ptx_entries(QWEN3_30B, dataclasses.replace(config, cache_hints="normal"),
                          tmp_path / "normal", monkeypatch)["copy"]
    assert ".cs." not in normal


def test_ptx_split_bulk_moves_rows_with_bulk_copies(tmp_path, monkeypatch):
    _, copy = _route_and_copy_ptx(point(mdc.SPLIT_BULK, 128, 8, 2),
                                  "bulk_copy", tmp_path, monkeypatch)
    assert ".reqntid 32, 1, 1" in copy
    # x never passes through registers: per token one bulk load into shared memory (completing
    # on an mbarrier) and one bulk store, issued by the lane of its k; 2 tokens a block.
    assert not GLOBAL_ACCESS.search(copy.replace("ld.global.b32", ""))
    loads = re.findall(r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes",
                       copy)
    stores = re.findall(r"cp\.async\.bulk\.global\.shared::cta\.bulk_group", copy)
    assert len(loads) == 2 and len(stores) == 2
    assert copy.count("mbarrier.init.shared") == 2
    # The loads of x are issued before the wait for routing, the row indices read after it,
    # and the block ends only when the stores have read shared memory.
    wait = copy.index("griddepcontrol.wait")
    assert copy.index("cp.async.bulk.shared::cluster") < wait < copy.index("ld.global.b32")
    assert wait < copy.index("cp.async.bulk.global.shared::cta")
    assert re.search(r"cp\.async\.bulk\.wait_group\.read\s+0;", copy)


def test_ptx_64_bit_vectors_and_no_padding_code_for_pad_1(tmp_path, monkeypatch):
    config = point(mdc.FUSED, 32, 1, 1)
    ptx = _ptx_entries(SYNTHETIC, config, tmp_path, monkeypatch)["fused"]
    _assert_barrier(ptx)
    widths = _widths(ptx)
    assert set(widths) <= {("ld", 64), ("st", 64), ("ld", 32), ("st", 32)}, widths
    # One token's load and a store per k (top-k 3); pad 1 has no padding rows to zero.
    assert widths[("ld", 64)] == 1 and widths[("st", 64)] == 3
    assert not re.search(r"(ld|st)\.global(\.\w+)*\.(v4\.[bfsu]32|v2\.[bfsu]64)", ptx)


@pytest.mark.parametrize("zero_padding", [False, True])
def test_ptx_replicated_ranks_without_barrier_or_atomics(zero_padding, tmp_path, monkeypatch):
    problem = dataclasses.replace(QWEN3_30B, zero_padding=zero_padding)
    config = point(mdc.REPLICATED, 128, 1, 1)
    entries = _ptx_entries(problem, config, tmp_path, monkeypatch)
    assert set(entries) == {"replicated"}
    ptx = entries["replicated"]
    # Nothing waits on another block: no barrier word, no atomics of any kind (the slots
    # come from ranks by ballots, the same in every block): one ballot per bit of the key,
    # local expert + 1 in [0, 128], in the rank loop.
    assert not re.search(r"\b(atom|red)\.", ptx) and "ld.acquire" not in ptx
    assert len(re.findall(r"\bvote\.sync\.ballot\.b32\b", ptx)) == 8
    assert "match." not in ptx
    widths = _widths(ptx)
    assert set(widths) <= {("ld", 128), ("st", 128), ("ld", 32), ("st", 32)}, widths
    zero_stores = len(ZERO_STORE.findall(ptx))
    assert (zero_stores >= 1) == zero_padding
    # x and the ids are loaded before routing: ahead of the first block barrier, the vectors
    # of the block's first PRELOADED_VECTORS units (a token each here) and every id a thread
    # routes (1024 pairs over 32 threads); then one vector per unit in the loop over the
    # rest, each stored to the token's 8 rows.
    preloaded = mdc.PRELOADED_VECTORS
    before_routing = Counter((op, int(lanes or 1) * int(bits)) for op, lanes, bits
                             in GLOBAL_ACCESS.findall(ptx[:ptx.index("bar.sync")]))
    assert before_routing == {("ld", 128): preloaded, ("ld", 32): mdc.REPLICATED_MAX_PAIRS // 32}
    assert widths[("ld", 128)] == preloaded + 1
    assert widths[("st", 128)] == 8 * (preloaded + 1) + zero_stores

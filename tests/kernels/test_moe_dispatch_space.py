"""moe_dispatch's Config space, seed heuristic, cost, the grid barrier's arithmetic, the launch
path's residency check and the registered KernelDef (no compiling, no GPU)."""

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch

from cutetune.device.roofline import predict
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.kernels import moe_common as moe
from cutetune.kernels import moe_dispatch as md
from cutetune.kernels.cost import resident_blocks_per_sm
from cutetune.kernels.moe_dispatch import KERNEL
from cutetune.kernels.moe_dispatch import common as mdc
from cutetune.kernels.moe_dispatch.device import barrier_increment
from cutetune.kernels.moe_dispatch.launcher import (
    CompiledDispatch,
    CooperativeGridError,
    check_cooperative_grid,
    resident_capacity,
)
from cutetune.kernels.moe_dispatch.space import SPACE, cost, default_config, default_routing_grid
from cutetune.kernels.moe_dispatch.split_block_ranks_kernels import rank_code
from cutetune.kernels.registry import get_kernel
from cutetune.spaces.models import PRESETS
from cutetune.spaces.space import EmptySpaceError, config_to_dict
from testkit.moe_dispatch_points import point

H200 = DEVICE_SPECS["H200"]
MOE_PRESETS = [name for name, m in PRESETS.items() if m.num_experts]
TOKENS = (1, 2, 4, 7, 16, 17, 64, 256, 257, 1000, 4096, 32768, 2**20)


def problem(**changes) -> moe.MoEProblem:
    base = moe.MoEProblem(num_tokens=1, dtype="bfloat16", hidden=2048, experts=128, top_k=8,
                          pad=16, expert_begin=0, expert_end=128)
    return dataclasses.replace(base, **changes)


def preset_problem(name: str, tokens: int = 1) -> moe.MoEProblem:
    (p,) = KERNEL.problems_for_model(PRESETS[name], "bfloat16")
    return p.with_tokens(tokens)


def rejections(p, device=H200) -> dict:
    return {r.config: r.constraint for r in SPACE.enumerate(p, device).rejected}


# ---------------------------------------------------------------------------------------------
# Registration


def test_registered_with_the_moe_contract():
    assert get_kernel("moe_dispatch") is KERNEL
    assert KERNEL.problem_type is moe.MoEProblem
    assert KERNEL.problems_for_model is moe.problems_for_model
    assert KERNEL.check is moe.check_dispatch
    assert KERNEL.outputs == ("counts", "offsets", "row_of", "dispatched", "error")
    assert KERNEL.written_in_place == ()


def test_make_inputs_and_reference_on_the_cpu():
    p = problem(num_tokens=5, expert_begin=32, expert_end=96)
    tensors = KERNEL.make_inputs(p, "cpu", torch.Generator().manual_seed(0))
    L = p.local_experts
    shapes = {name: (tuple(t.shape), t.dtype) for name, t in tensors.items()}
    assert shapes == {
        "x": ((5, 2048), torch.bfloat16),
        "topk_ids": ((5, 8), torch.int32),
        "counts": ((L,), torch.int32),
        "offsets": ((L + 1,), torch.int32),
        "row_of": ((5, 8), torch.int32),
        "dispatched": ((p.capacity, 2048), torch.bfloat16),
        "error": ((1,), torch.int32),
        "workspace": ((mdc.workspace_words(L),), torch.int32),
    }
    # The workspace starts zeroed: the barrier word's low bits, the epoch, the counters.
    assert not tensors["workspace"].any()
    expected = KERNEL.reference(tensors, p)
    KERNEL.check(expected, expected, p)
    assert int(expected["counts"].sum()) < 5 * 8  # some pairs go to other experts


def test_workspace_regions_do_not_overlap():
    for L in (1, 8, 31, 32, 128, 1024):
        counters_end = mdc.WS_COUNTERS + 2 * (L + 1)
        assert mdc.WS_BARRIER + 1 <= mdc.WS_EPOCH and mdc.WS_EPOCH + 1 <= mdc.WS_COUNTERS
        # The barrier word and the epoch sit on 128-byte lines of their own.
        assert {mdc.WS_BARRIER * 4 // 128, mdc.WS_EPOCH * 4 // 128, mdc.WS_COUNTERS * 4 // 128} \
            == {0, 1, 2}
        assert counters_end <= mdc.ws_padding(L)
        # The padded-segment list, then the published counts' table.
        assert mdc.ws_published(L) == mdc.ws_padding(L) + 1 + 2 * L
        assert mdc.workspace_words(L) == mdc.ws_published(L) + mdc.PUBLISHED_COUNT_WORDS


def test_routing_blocks_publish_counts_only_where_few():
    # Mixtral's 8 experts: 8 and 32 routing blocks publish (72 and 288 words), 128 do not
    # (1152); Qwen3's 128 never do (1032 words at 8 blocks).
    assert [mdc.publishes_counts(8, blocks) for blocks in mdc.ROUTING_GRIDS] == [True, True, False]
    assert not any(mdc.publishes_counts(128, blocks) for blocks in mdc.ROUTING_GRIDS)
    assert mdc.publishes_counts(63, 8) and not mdc.publishes_counts(64, 8)


# ---------------------------------------------------------------------------------------------
# Constraints


def test_each_form_declares_only_its_own_knobs():
    knobs = {form.config_type.form: {p.name for p in form.params} for form in SPACE.forms}
    common = {"grid_blocks", "warps_per_block", "tokens_per_block"}
    assert knobs == {mdc.FUSED: common, mdc.REPLICATED: common, mdc.SPLIT_BULK: common,
                     mdc.SPLIT: common | {"cache_hints"},
                     mdc.SPLIT_BLOCK_RANKS: common | {"cache_hints"}}
    # Only the forms whose blocks only route offer the narrowest grid.
    for form in SPACE.forms:
        grids = next(p.choices for p in form.params if p.name == "grid_blocks")
        assert (8 in grids) == (form.config_type.form in mdc.SPLIT_FORMS)


def test_a_point_reads_back_as_the_form_it_was():
    for config in SPACE.declared_points():
        stored = config_to_dict(config)
        assert stored["form"] == config.form
        assert SPACE.config_from_dict(stored) == config
    # Two forms with the same knob values are different points.
    assert point(mdc.FUSED, 128, 4, 1) != point(mdc.REPLICATED, 128, 4, 1)
    with pytest.raises(ValueError, match="unknown form 'policy'"):
        SPACE.config_from_dict({"form": "policy", "grid_blocks": 8})


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_preset_points_use_128_bit_vectors(name):
    p = preset_problem(name)
    enumeration = SPACE.enumerate(p, H200)
    assert enumeration.valid
    assert mdc.vector_bits(p) == 128
    # One token: no point batches more than one token per thread.
    assert {c.tokens_per_block for c in enumeration.valid} == {1}
    # split_block_ranks where its table fits: Mixtral's 8 experts, not the others' 128 or 256.
    few_experts = mdc.publishes_counts(p.local_experts, 8)
    assert {c.form for c in enumeration.valid} == (
        {mdc.FUSED, mdc.REPLICATED, mdc.SPLIT, mdc.SPLIT_BULK}
        | ({mdc.SPLIT_BLOCK_RANKS} if few_experts else set()))
    names = {c.name for c in SPACE.constraints} | {c.name for f in SPACE.forms
                                                    for c in f.constraints}
    for rejection in enumeration.rejected:
        assert rejection.constraint in names


def test_a_hidden_size_only_64_bit_vectors_divide_is_copied_in_64_bit_vectors():
    # fp16 1004 = 251 x 4 elements: 64-bit vectors divide it, 128-bit ones do not.
    p = problem(dtype="float16", hidden=1004)
    assert mdc.vector_bits(p) == 64
    assert SPACE.valid_points(p, H200)
    SPACE.check(p, default_config(p, H200), H200)


def test_an_odd_hidden_size_has_no_point_and_says_why():
    p = problem(hidden=1001)
    with pytest.raises(EmptySpaceError, match="hidden_splits_into_vectors"):
        default_config(p, H200)


def test_block_ranks_only_where_the_table_fits():
    # The copy reads grid_blocks x (L + 1) words: Mixtral's 8 experts at 8 and 32 routing
    # blocks (72 and 288 words), not at 128 (1152), and never Qwen3's 128 experts.
    mixtral = rejections(problem(num_tokens=64, experts=8, top_k=2, expert_end=8))
    for blocks in (8, 32):
        assert point(mdc.SPLIT_BLOCK_RANKS, blocks, 8, 1) not in mixtral
    assert mixtral[point(mdc.SPLIT_BLOCK_RANKS, 128, 8, 1)] == \
        "block_ranks_table_fits"
    qwen = rejections(problem(num_tokens=64))
    assert qwen[point(mdc.SPLIT_BLOCK_RANKS, 8, 8, 1)] == \
        "block_ranks_table_fits"


def test_block_ranks_codes_bound_the_pairs_a_routing_block_takes():
    # A rank code is -2 - (rank * L + local): 8 blocks of Mixtral's (top-2, 8 experts) take
    # ceil(tokens / 4) pairs each, so the codes run out at 2^30 tokens, not below.
    config = point(mdc.SPLIT_BLOCK_RANKS, 8, 8, 1)
    mixtral = problem(experts=8, top_k=2, expert_end=8)
    assert SPACE.first_violation(mixtral.with_tokens(2**30 - 4), config, H200) is None
    violation = SPACE.first_violation(mixtral.with_tokens(2**30), config, H200)
    assert violation.name == "block_ranks_encode"
    assert rank_code(0, 0, 8) == -2 and rank_code(3, 5, 8) == -2 - 29


def test_block_ranks_launch_refuses_calls_past_the_codes():
    # The space checks the tuned bucket; a compiled point may be called with more tokens, so
    # the launch path checks too, before anything launches (shape only: nothing is allocated).
    config = point(mdc.SPLIT_BLOCK_RANKS, 8, 8, 1)
    mixtral = problem(experts=8, top_k=2, expert_end=8)
    launched = []
    compiled = CompiledDispatch(mixtral, config, lambda *args: launched.append(args))
    compiled(torch.empty(1, 1).expand(2**30 - 4, 4096), *range(7))
    with pytest.raises(ValueError, match=r"1073741824 tokens are too many for "
                                         r"split_block_ranks over 8 routing blocks"):
        compiled(torch.empty(1, 1).expand(2**30, 4096), *range(7))
    assert len(launched) == 1


def test_tokens_per_block_is_bounded_by_the_tokens():
    rejected = rejections(problem(num_tokens=3))
    assert rejected[point(mdc.SPLIT, 32, 4, 4)] == \
        "tokens_per_block_within_tokens"
    assert point(mdc.SPLIT, 32, 4, 2) not in rejected


def test_three_tokens_per_block_for_block_ranks_within_the_tokens():
    mixtral = problem(num_tokens=4096, experts=8, top_k=2, expert_end=8, hidden=4096)
    ranks = point(mdc.SPLIT_BLOCK_RANKS, 8, 8, 3, "streaming")
    SPACE.check(mixtral, ranks, H200)
    # Like every batch, not more tokens than the call has.
    assert rejections(mixtral.with_tokens(2))[ranks] == "tokens_per_block_within_tokens"


def test_bulk_copy_rows_fit_shared_memory():
    # DeepSeek-V3's 7168-wide bf16 rows: two (28 KiB) fit 48 KiB, four (56 KiB) do not; the
    # vector copy holds no rows in shared memory.
    rejected = rejections(preset_problem("deepseek-v3", 4096))
    assert rejected[point(mdc.SPLIT_BULK, 128, 8, 4)] == "bulk_rows_fit_smem"
    assert point(mdc.SPLIT_BULK, 128, 8, 2) not in rejected
    assert point(mdc.SPLIT, 128, 8, 4) not in rejected


def test_bulk_copy_rows_are_whole_16_byte_granules():
    # fp16 1004 is 2008 bytes a row; 1008 is 2016 = 126 x 16.
    config = point(mdc.SPLIT_BULK, 128, 8, 1)
    assert rejections(problem(dtype="float16", hidden=1004))[config] == "bulk_rows_whole_16_bytes"
    assert config in SPACE.valid_points(problem(dtype="float16", hidden=1008), H200)


def test_bulk_copy_stores_from_one_warp():
    p = problem(num_tokens=64, experts=64, expert_end=64, top_k=33)
    rejected = rejections(p)
    assert rejected[point(mdc.SPLIT_BULK, 128, 8, 1)] == "bulk_top_k_within_warp"
    assert point(mdc.SPLIT, 128, 8, 1) not in rejected
    assert point(mdc.SPLIT_BULK, 128, 8, 1) not in rejections(
        dataclasses.replace(p, top_k=32))


def test_fused_form_is_limited_to_few_pairs():
    # 256 tokens x 8 = 2048 pairs: fused still routes them in one block; 257 do not.
    assert point(mdc.FUSED, 128, 4, 1) in SPACE.valid_points(
        problem(num_tokens=256), H200)
    rejected = rejections(problem(num_tokens=257))
    assert rejected[point(mdc.FUSED, 128, 4, 1)] == "fused_routes_few_pairs"
    assert point(mdc.SPLIT, 128, 4, 1) not in rejected


def test_replicated_form_is_limited_to_fewer_pairs():
    # 128 tokens x 8 = 1024 pairs: every block still ranks them; 129 tokens do not.
    config = point(mdc.REPLICATED, 128, 1, 1)
    assert config in SPACE.valid_points(problem(num_tokens=128), H200)
    rejected = rejections(problem(num_tokens=129))
    assert rejected[config] == "replicated_ranks_few_pairs"
    assert point(mdc.FUSED, 128, 1, 1) not in rejected


def test_too_many_local_experts_for_the_scan():
    p = problem(experts=2048, expert_end=2048)
    with pytest.raises(EmptySpaceError, match="local_experts_fit_scan"):
        SPACE.valid_points(p, H200)
    # A local range of 1024 of them is fine.
    assert SPACE.valid_points(problem(experts=2048, expert_begin=1024, expert_end=2048), H200)


def test_counters_must_fit_shared_memory(monkeypatch):
    # 128 local experts need 4 * (2 * 128 + 1 + 3 * 128 + 3) bytes of counters and lists;
    # the replicated form adds a local expert and a row for each of up to 1024 pairs, and
    # each warp's count per expert.
    fused = point(mdc.FUSED, 128, 1, 1)
    replicated = point(mdc.REPLICATED, 128, 1, 1)
    assert mdc.smem_bytes(problem(), fused) == 2576
    assert mdc.smem_bytes(problem(), replicated) == 2576 + 2 * 4 * 1024 + 4 * 128
    assert mdc.smem_bytes(problem(), dataclasses.replace(replicated, warps_per_block=8)) == \
        2576 + 2 * 4 * 1024 + 8 * 4 * 128
    monkeypatch.setattr(md.space, "SMEM_PER_BLOCK", 4096)
    rejected = rejections(problem())
    assert rejected[replicated] == "counters_fit_smem" and fused not in rejected
    monkeypatch.setattr(md.space, "SMEM_PER_BLOCK", 2048)
    assert set(rejections(problem()).values()) >= {"counters_fit_smem"}
    with pytest.raises(EmptySpaceError, match="counters_fit_smem"):
        SPACE.valid_points(problem(), H200)


def test_cooperative_grid_must_fit_a_small_device():
    # 8 SMs, a quarter of the register file, 4 blocks per SM: 32 one-warp blocks fit (4 per
    # SM), 32 blocks of 8 warps do not (52 registers x 256 threads leaves room for one per
    # SM), and 128 blocks never do.
    small = dataclasses.replace(H200, sm_count=8, registers_per_sm=16384, max_blocks_per_sm=4)
    rejected = rejections(problem(), small)
    for policy in (mdc.FUSED, mdc.SPLIT):
        assert point(policy, 32, 1, 1) not in rejected
        assert rejected[point(policy, 32, 8, 1)] == "cooperative_grid_fits"
        for warps in (1, 4, 8):
            assert rejected[point(policy, 128, warps, 1)] == \
                "cooperative_grid_fits"
    # The constraint agrees with the roofline's residency model.
    c = mdc.cooperative_cost(problem(), point(mdc.FUSED, 32, 8, 1))
    assert c.registers_per_thread == 52
    assert resident_blocks_per_sm(c, small) == 1
    # The replicated kernel has no barrier: its blocks need not be resident at once.
    for warps in (1, 4, 8):
        assert point(mdc.REPLICATED, 128, warps, 1) not in rejected


def test_block_size_within_a_small_device():
    small = dataclasses.replace(H200, max_threads_per_block=128)
    rejected = rejections(problem(), small)
    assert rejected[point(mdc.SPLIT, 32, 8, 1)] == "block_size_within_device"
    assert point(mdc.SPLIT, 32, 4, 1) not in rejected


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_every_valid_point_is_resident_and_predictable_on_every_device(name):
    for device in DEVICE_SPECS.values():
        for tokens in (1, 64, 4096):
            p = preset_problem(name, tokens)
            for config in SPACE.enumerate(p, device).valid:
                c = cost(p, config, device)
                assert resident_blocks_per_sm(c, device) >= 1, (device.name, config)
                assert predict(c, device, Ceilings.from_datasheet(device)).predicted_us > 0


# ---------------------------------------------------------------------------------------------
# The seed heuristic


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_default_config_is_valid_replicated_for_few_tokens_and_split_for_many(name):
    policies = []
    for tokens in TOKENS:
        p = preset_problem(name, tokens)
        config = default_config(p, H200)
        SPACE.check(p, config, H200)
        pairs = tokens * p.top_k
        if config.form == mdc.SPLIT_BLOCK_RANKS:
            # Mixtral's prefill up to 16384 pairs (test_default_takes_block_ranks_...).
            assert config == point(mdc.SPLIT_BLOCK_RANKS, 8, 8, 3, "streaming")
            policies.append(mdc.SPLIT)
            continue
        assert config.tokens_per_block == 1
        if config.form == mdc.REPLICATED:
            assert pairs <= mdc.REPLICATED_MAX_PAIRS
            assert config.grid_blocks == 128
            assert config.warps_per_block == (4 if pairs <= 256 else 8)
        else:
            assert config.grid_blocks == default_routing_grid(pairs)
            assert config.warps_per_block == 8
            assert config.cache_hints == "streaming"
        policies.append(config.form)
    # Replicated for the first (decode) sizes, split from some size on, never back.
    assert policies[0] == mdc.REPLICATED and policies[-1] == mdc.SPLIT
    first_split = policies.index(mdc.SPLIT)
    assert set(policies[first_split:]) == {mdc.SPLIT}


def test_default_takes_block_ranks_for_few_experts_up_to_16384_local_pairs():
    # Mixtral (8 experts, top-2): 512 tokens replicated, 513 to 8192 split_block_ranks, 8193
    # split. Qwen3-30B-A3B's 128 experts never, nor 9 experts; 8 of its experts at 4096 tokens
    # (2048 of 32768 pairs local) do, up to 32768 tokens (16384 local pairs).
    mixtral = problem(experts=8, top_k=2, expert_end=8, hidden=4096)
    ranks = point(mdc.SPLIT_BLOCK_RANKS, 8, 8, 3, "streaming")
    assert default_config(mixtral.with_tokens(512), H200).form == mdc.REPLICATED
    assert default_config(mixtral.with_tokens(513), H200) == ranks
    assert default_config(mixtral.with_tokens(8192), H200) == ranks
    assert default_config(mixtral.with_tokens(8193), H200).form == mdc.SPLIT
    nine = problem(num_tokens=4096, experts=9, top_k=2, expert_end=9, hidden=4096)
    assert default_config(nine, H200).form == mdc.SPLIT
    assert default_config(problem(num_tokens=1024), H200).form == mdc.SPLIT
    eight = problem(expert_end=8)
    assert default_config(eight.with_tokens(4096), H200) == ranks
    assert default_config(eight.with_tokens(32768), H200) == ranks
    assert default_config(eight.with_tokens(32769), H200).form == mdc.SPLIT


def test_default_switches_where_the_replicated_form_stops():
    # Qwen3-30B-A3B, top-8: 128 tokens are 1024 pairs (replicated), 129 are not (split).
    assert default_config(problem(num_tokens=32), H200).warps_per_block == 4
    assert default_config(problem(num_tokens=33), H200).warps_per_block == 8
    assert default_config(problem(num_tokens=128), H200).form == mdc.REPLICATED
    assert default_config(problem(num_tokens=129), H200).form == mdc.SPLIT


def test_default_narrows_where_a_point_does_not_fit():
    # 1024 local experts: 8 warps' counts overflow 48 KiB of shared memory, 4 warps' do not.
    p = problem(num_tokens=64, experts=1024, expert_end=1024)
    assert rejections(p)[point(mdc.REPLICATED, 128, 8, 1)] == \
        "counters_fit_smem"
    assert default_config(p, H200) == point(mdc.REPLICATED, 128, 4, 1)
    # 16 SMs of 4 blocks hold 64 cooperative blocks: split's routing grid of 128 blocks (the
    # default's at 32768 tokens of top-8) narrows to 32.
    small = dataclasses.replace(H200, sm_count=16, max_blocks_per_sm=4)
    assert default_config(problem(num_tokens=32768), H200).grid_blocks == 128
    config = default_config(problem(num_tokens=32768), small)
    assert config == point(mdc.SPLIT, 32, 8, 1, "streaming")
    SPACE.check(problem(num_tokens=32768), config, small)


def test_cost_by_hand_fused():
    # 4 tokens of Qwen3-30B-A3B (bf16, hidden 2048: a row is 4096 bytes), 32 pairs, the
    # padding rows zeroed.
    p = problem(num_tokens=4, zero_padding=True)
    c = cost(p, point(mdc.FUSED, 128, 4, 1), H200)
    routing = 4 * 32 + 4 * 32 + 4 * (2 * 128 + 2)  # ids read, row_of written, counts/offsets
    copy = 4 * 4096 + 32 * 4096  # x read once per token, each pair's row written once
    padding = 32 * 15 // 2 * 4096  # 32 non-empty segments pad 7.5 rows each on average
    assert c.bytes_moved == routing + copy + padding == 1131784
    assert c.flops == 0
    assert (c.blocks, c.threads_per_block, c.launches, c.grid_barriers) == (128, 128, 1, 1)
    assert c.registers_per_thread == 40 + 4 + 8
    assert c.smem_per_block == 2576
    assert c.bytes_in_flight_per_thread == 16
    # Padding left unwritten moves no bytes.
    unpadded = cost(problem(num_tokens=4), point(mdc.FUSED, 128, 4, 1), H200)
    assert unpadded.bytes_moved == routing + copy


def test_cost_by_hand_replicated():
    # As fused, without the barrier; the smem holds the per-pair arrays too.
    p = problem(num_tokens=4)
    c = cost(p, point(mdc.REPLICATED, 32, 1, 1), H200)
    assert c.bytes_moved == 4 * 32 + 4 * 32 + 4 * (2 * 128 + 2) + 4 * 4096 + 32 * 4096
    assert (c.blocks, c.threads_per_block, c.launches, c.grid_barriers) == (32, 32, 1, 0)
    assert c.smem_per_block == 2576 + 8192 + 512
    # Base, a vector and 8 rows, as the other forms; then 4 preloaded vectors and the 32 ids
    # each of 32 threads loads before routing (1024 pairs at most).
    assert c.registers_per_thread == 40 + 4 + 8 + 4 * 4 + 32


def test_cost_by_hand_split_with_a_local_range():
    # 4096 tokens, experts [32, 96) of 128: under uniform routing half the pairs are local.
    p = problem(num_tokens=4096, expert_begin=32, expert_end=96, zero_padding=True)
    c = cost(p, point(mdc.SPLIT, 128, 8, 2), H200)
    pairs = 4096 * 8
    local_pairs = pairs // 2
    routing = 4 * pairs + 4 * pairs + 4 * (2 * 64 + 2)
    copy = 4096 * 4096 + local_pairs * 4096
    padding = 64 * 15 * 4096 // 2  # every local segment is non-empty
    assert c.bytes_moved == routing + copy + padding
    # The copy kernel's grid: 2048 token pairs x 1 slice (256 vectors, 256 threads).
    assert (c.blocks, c.threads_per_block, c.launches, c.grid_barriers) == (2048, 256, 2, 1)
    assert c.bytes_in_flight_per_thread == 32


def test_cost_by_hand_split_block_ranks():
    # split's bytes and copy grid, no grid barrier, and the copy block's shared memory: the
    # routing blocks' table (8 x 9 words), their bases (8 x 8) and a group's 2 x 2 rows.
    p = problem(num_tokens=4096, experts=8, top_k=2, expert_end=8)
    ranks = cost(p, point(mdc.SPLIT_BLOCK_RANKS, 8, 8, 2), H200)
    split = cost(p, point(mdc.SPLIT, 8, 8, 2), H200)
    assert ranks.bytes_moved == split.bytes_moved
    assert (ranks.blocks, ranks.launches, ranks.grid_barriers) == (split.blocks, 2, 0)
    routing = 4 * (2 * 32 + 1 + 3 * 8 + mdc.SMEM_FLAGS)
    assert ranks.smem_per_block == routing + 4 * (8 * 9 + 8 * 8 + 2 * 2)


def test_cost_by_hand_split_bulk():
    # The same bytes as split; the copy grid is one warp per 4 tokens, each holding 4 rows
    # (and 4 mbarriers) in shared memory, 4 * 4096 / 32 bytes in flight per thread.
    p = problem(num_tokens=4096)
    bulk = cost(p, point(mdc.SPLIT_BULK, 128, 8, 4), H200)
    vector = cost(p, point(mdc.SPLIT, 128, 8, 4), H200)
    assert bulk.bytes_moved == vector.bytes_moved
    assert (bulk.blocks, bulk.threads_per_block, bulk.launches, bulk.grid_barriers) == \
        (1024, 32, 2, 1)
    assert bulk.smem_per_block == 4 * (4096 + 8)
    assert bulk.bytes_in_flight_per_thread == 4 * 4096 // 32


def test_expected_padding_rows():
    assert mdc.expected_padding_rows(problem(num_tokens=1)) == 8 * 7.5
    assert mdc.expected_padding_rows(problem(num_tokens=1000)) == 128 * 7.5
    assert mdc.expected_padding_rows(problem(num_tokens=1000, pad=1)) == 0


# ---------------------------------------------------------------------------------------------
# The grid barrier's arithmetic


@pytest.mark.parametrize("blocks", [1, 2, 5, 32, 128, 132])
@pytest.mark.parametrize("start", [0, 1 << 31])
def test_barrier_word_flips_its_top_bit_exactly_at_the_last_arrival(blocks, start):
    rng = random.Random(blocks)
    word = start
    for barrier in range(4):  # consecutive barriers on one word, no reset
        order = list(range(blocks))
        rng.shuffle(order)
        top = word >> 31
        for i, block in enumerate(order):
            arrived = word
            word = (word + barrier_increment(blocks, block)) % (1 << 32)
            # Each arrival waits for the top bit to differ from what it saw: none may pass
            # before the last arrival, all may after it.
            assert arrived >> 31 == top
            assert (word >> 31 != top) == (i == blocks - 1), (barrier, i)
        # The low bits are back where they started: the next barrier (or call, or grid
        # size) needs no reset.
        assert word & 0x7FFFFFFF == start & 0x7FFFFFFF


def test_barrier_words_of_different_grid_sizes_share_a_word():
    word = 0
    for blocks in (128, 32, 1, 132):
        for block in range(blocks):
            word = (word + barrier_increment(blocks, block)) % (1 << 32)
        assert word & 0x7FFFFFFF == 0
    assert all(-(1 << 31) <= barrier_increment(n, 0) < 1 << 31 for n in (1, 2, 132, 65535))


# ---------------------------------------------------------------------------------------------
# The launch path's residency check


def props(sms=132, threads_per_sm=2048, registers=65536, smem=228 * 1024, name="GPU",
          blocks=None):
    fields = dict(multi_processor_count=sms, max_threads_per_multi_processor=threads_per_sm,
                  regs_per_multiprocessor=registers, shared_memory_per_multiprocessor=smem,
                  name=name)
    if blocks is not None:
        fields["max_blocks_per_multi_processor"] = blocks
    return SimpleNamespace(**fields)


def test_resident_capacity_by_threads_registers_and_smem():
    assert resident_capacity(256, 52, 2572, props()) == 132 * 4  # registers: 65536 // 13312
    # 39 by registers (65536 // 1664), but torch does not report the blocks an SM holds: the
    # least of any GPU since Volta, 16, unless the properties say more.
    assert resident_capacity(32, 52, 0, props()) == 132 * 16
    assert resident_capacity(32, 52, 0, props(blocks=32)) == 132 * 32
    assert resident_capacity(128, 32, 100 * 1024, props()) == 132 * 2  # shared memory
    assert resident_capacity(1024, 32, 0, props()) == 132 * 2  # threads
    # A torch without the shared-memory field: threads and registers only.
    no_smem = props()
    del no_smem.shared_memory_per_multiprocessor
    assert resident_capacity(128, 32, 100 * 1024, no_smem) == 132 * 16


def test_check_cooperative_grid_raises_before_launch():
    check_cooperative_grid(128, 256, 52, 2572, props())
    with pytest.raises(CooperativeGridError,
                       match="a cooperative grid of 128 blocks of 256 threads does not fit "
                             "tiny, which holds 16 at once"):
        check_cooperative_grid(128, 256, 52, 2572, props(sms=4, name="tiny"))
    assert issubclass(CooperativeGridError, RuntimeError)  # the tuner's launch failures


def test_compiled_dispatch_checks_each_device_once_before_calling(monkeypatch):
    calls = []

    def fake_properties(device):
        calls.append(device)
        return props(sms=8, name="small") if device == 1 else props()

    monkeypatch.setattr(torch.cuda, "get_device_properties", fake_properties)
    launched = []
    config = point(mdc.FUSED, 128, 8, 1)
    compiled = CompiledDispatch(problem(), config, lambda *args: launched.append(args))
    x = SimpleNamespace(get_device=lambda: 0)
    compiled(x, *range(7))
    compiled(x, *range(7))
    assert calls == [0] and len(launched) == 2
    other = SimpleNamespace(get_device=lambda: 1)
    with pytest.raises(CooperativeGridError, match="128 blocks"):
        compiled(other, *range(7))
    assert len(launched) == 2  # nothing launched on the device that cannot hold the grid

"""The CI compile checks of moe_dispatch_fp8_quant: the covering points (every pair of knob
values, and the defaults served at every bucket) compile for sm_90a on the CPU for DeepSeek-V3's
problem (at 4 tokens, so that every tokens_per_block is valid) and a synthetic one that adds
fp16, groups of 64, row-major UE8M0 scales, zeroed padding and a local expert range; the PTX
shows split's routing kernel with its grid barrier and no zeroing, and a copy kernel that loads
and quantises before it waits for routing (one e4m3 conversion per element pair, one division
per element, the group's shuffles), then stores each token's codes and scale to its K rows,
with the configured cache hints, and with zeroed padding the padding rows' zero codes and
scales. The `sweep` marker compiles every valid point."""

import re
import struct
from collections import Counter

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.moe_dispatch_fp8_quant import (
    KERNEL,
    DispatchFP8QuantConfig,
    MoEDispatchFP8QuantProblem,
)
from cutetune.spaces.buckets import BUCKETS
from cutetune.spaces.models import PRESETS
from testkit.compile_checks import GLOBAL_ACCESS, assert_points_compile, ptx_of
from testkit.covering_points import WHICH_POINTS, narrowed, served_defaults

H200 = DEVICE_SPECS["H200"]
(DEEPSEEK,) = KERNEL.problems_for_model(PRESETS["deepseek-v3"], "bfloat16")
SYNTHETIC = MoEDispatchFP8QuantProblem(
    num_tokens=4, dtype="float16", hidden=1536, experts=20, top_k=3, pad=8, expert_begin=5,
    expert_end=17, zero_padding=True, group_size=64, column_major_scales=False, ue8m0=True)
PROBLEMS = [pytest.param(DEEPSEEK.with_tokens(4), id="deepseek-v3"),
            pytest.param(SYNTHETIC, id="synthetic")]


def test_the_problems_reach_every_knob_value():
    for problem in (DEEPSEEK.with_tokens(4), SYNTHETIC):
        valid = KERNEL.space.enumerate(problem, H200).valid
        for param in KERNEL.space.params:
            values = {getattr(c, param.name) for c in valid}
            # Groups of 64 are 8 vectors: at most 8 lanes.
            expected = set(param.choices) - ({16} if param.name == "lanes_per_group"
                                             and problem.group_size == 64 else set())
            assert values == expected, (problem.describe(), param.name)


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("problem", PROBLEMS)
def test_points_compile(problem, which):
    valid = KERNEL.space.enumerate(problem, H200).valid
    points = list(dict.fromkeys([*served_defaults(KERNEL, problem, H200, BUCKETS),
                                 *narrowed(which, valid)]))
    assert_points_compile(KERNEL, problem, points)


# ---------------------------------------------------------------------------------------------
# PTX

RELEASE_ARRIVAL = re.compile(r"\batom(?:\.global)?\.release(?:\.gpu)?(?:\.global)?\.add\.[us]32\b")


def _entries(problem, config, tmp_path, monkeypatch) -> dict[str, str]:
    ptx = ptx_of(KERNEL, problem, config, H200, tmp_path, monkeypatch)
    entries = {}
    for chunk in ptx.split(".visible .entry ")[1:]:
        entries[re.match(r"kernel_cutlass_(\w+?)_kernel_", chunk).group(1)] = chunk
    return entries


def _widths(ptx: str) -> Counter:
    return Counter((op, int(lanes or 1) * int(bits))
                   for op, lanes, bits in GLOBAL_ACCESS.findall(ptx))


def _instructions(ptx: str) -> Counter:
    return Counter(re.findall(r"\b(cvt\.rn\.satfinite\.e4m3x2\.f32|div\.rn\.f32|rcp\.rn\.f32"
                              r"|shfl\.sync\.bfly\.b32)\b", ptx))


@pytest.mark.parametrize("config", [DispatchFP8QuantConfig(32, 8, 2, 8, "streaming"),
                                    DispatchFP8QuantConfig(8, 4, 1, 4, "normal"),
                                    DispatchFP8QuantConfig(128, 1, 4, 16, "normal")],
                         ids=lambda c: f"{c.tokens_per_block}tokens-{c.lanes_per_group}lanes")
def test_ptx_routes_then_quantises_each_token_once_and_stores_it_k_times(config, tmp_path,
                                                                         monkeypatch):
    problem = DEEPSEEK.with_tokens(4)
    entries = _entries(problem, config, tmp_path, monkeypatch)
    assert set(entries) == {"route", "quant_copy"}
    route, copy = entries["route"], entries["quant_copy"]
    # split's routing kernel: the grid barrier, and no hidden states (its zeroing is off).
    assert len(RELEASE_ARRIVAL.findall(route)) == 1
    assert not {("ld", 128), ("st", 128), ("st", 64)} & set(_widths(route))
    assert "griddepcontrol.launch_dependents" in route
    TPB, lanes = config.tokens_per_block, config.lanes_per_group
    per_lane = 128 // 8 // lanes  # vectors of a group of 128 bf16 per lane
    elements = TPB * per_lane * 8
    found = _instructions(copy)
    assert found["cvt.rn.satfinite.e4m3x2.f32"] == elements // 2
    # Each token's scale divided and inverted once; no division an element.
    assert found["div.rn.f32"] == found["rcp.rn.f32"] == TPB
    assert found["shfl.sync.bfly.b32"] == TPB * (lanes.bit_length() - 1)
    widths = _widths(copy)
    # Each token's vectors loaded once; its codes (64 bits a vector) and its scale stored to
    # each of its 8 rows; nothing else moves but 32-bit row indices.
    assert widths[("ld", 128)] == TPB * per_lane
    assert widths[("st", 64)] == TPB * per_lane * 8
    assert widths[("st", 32)] == TPB * 8  # the scales
    assert set(widths) <= {("ld", 128), ("st", 64), ("st", 32), ("ld", 32)}, widths
    # Loads and quantisation before the wait for routing, the row indices after it.
    wait = copy.index("griddepcontrol.wait")
    assert copy.rindex("ld.global.cs.v4" if config.cache_hints == "streaming"
                       else "ld.global.v4") < wait
    assert copy.rindex("cvt.rn.satfinite.e4m3x2.f32") < wait
    assert wait < copy.index("ld.global.b32") < copy.index("st.global")
    streaming = config.cache_hints == "streaming"
    assert ("ld.global.cs.v4" in copy) == streaming and ("st.global.cs.v2" in copy) == streaming
    assert ".cs." not in route


def test_ptx_of_zeroed_padding_and_ue8m0_scales(tmp_path, monkeypatch):
    config = DispatchFP8QuantConfig(8, 4, 1, 8, "normal")
    entries = _entries(SYNTHETIC, config, tmp_path, monkeypatch)
    route, copy = entries["route"], entries["quant_copy"]
    assert not {("st", 128), ("st", 64)} & set(_widths(route))  # routing zeroes nothing
    found = _instructions(copy)
    # Groups of 64 fp16 on 8 lanes: one vector a lane, multiplied by the scale's reciprocal
    # (one per token); the padding's scale, a group_scale of zero, folds to a constant.
    assert found["div.rn.f32"] == 1 and found["rcp.rn.f32"] == 1
    # A vector's codes, and the zeros' (identical conversions, which the compiler may merge).
    assert 4 < found["cvt.rn.satfinite.e4m3x2.f32"] <= 4 + 4
    assert "8388607" in copy and "2139095040" in copy  # the rounding up to a power of two
    # The padding rows, each slice of a row unrolled: zero codes, 64 bits a vector, and the
    # scale of an all-zero group, the floor's rounded up to 2^-42, stored as a constant; beside
    # them each token's codes stored to its 3 rows.
    assert str(struct.unpack("<I", struct.pack("<f", 2.0**-42))[0]) in copy
    assert _widths(copy)[("st", 64)] > 3
    assert copy.count("griddepcontrol.wait") == 2  # the tokens' units, then the padding

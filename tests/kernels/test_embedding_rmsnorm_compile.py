"""The CI compile checks: the covering points of the embedding_rmsnorm space (every pair of knob
values, and the defaults served at every bucket) compile for sm_90a on the CPU for one preset's
problem (bf16, int64 ids, a row that fits a warp: both forms) and for synthetic problems that
take every other code path: Gemma's scale in fp16 with int32 ids and a row whose vectors do not
divide among a block's threads (the predicated last vector), and fp32 rows of gpt-oss's width;
and the PTX of a few points shows the accesses, the compares and the scale the problem asks
for.

The `sweep` marker compiles every valid point.
"""

import re
import struct

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.cache_hints import NORMAL, STREAMING
from cutetune.kernels.embedding_rmsnorm import (
    KERNEL,
    EmbeddingRMSNormConfig,
    EmbeddingRMSNormProblem,
    rounded_scale,
)
from cutetune.kernels.rmsnorm import BLOCK_PER_ROW, WARP_PER_ROW
from cutetune.spaces.buckets import BUCKETS
from cutetune.spaces.models import PRESETS
from testkit.compile_checks import GLOBAL_ACCESS, assert_points_compile, ptx_of
from testkit.covering_points import covering_configs

H200 = DEVICE_SPECS["H200"]

(QWEN3_06B,) = KERNEL.problems_for_model(PRESETS["qwen3-0.6b"], "bfloat16")
(QWEN3_8B,) = KERNEL.problems_for_model(PRESETS["qwen3-8b"], "bfloat16")
GEMMA_SCALE = rounded_scale(1152**0.5, "float16")
GEMMA_FP16 = EmbeddingRMSNormProblem(
    num_tokens=1, dtype="float16", hidden=1152, vocab_size=262144, ids_dtype="int32", eps=1e-6,
    weight_bias=1.0, embed_scale=GEMMA_SCALE)
FP32_2880 = EmbeddingRMSNormProblem(
    num_tokens=1, dtype="float32", hidden=2880, vocab_size=201088, ids_dtype="int64",
    eps=1e-5, weight_bias=0.0, embed_scale=1.0)

PROBLEMS = [
    pytest.param(QWEN3_06B, id="qwen3-0.6b"),
    pytest.param(GEMMA_FP16, id="gemma-fp16-int32-scaled"),
    pytest.param(FP32_2880, id="fp32-2880"),
]


@pytest.mark.parametrize("problem", PROBLEMS)
def test_covering_points_compile(problem):
    configs = covering_configs(KERNEL, problem, H200, BUCKETS)
    assert {c.form for c in configs} == (
        {BLOCK_PER_ROW, WARP_PER_ROW} if problem.hidden <= 2048 else {BLOCK_PER_ROW})
    assert_points_compile(KERNEL, problem, configs)


@pytest.mark.sweep
@pytest.mark.parametrize("problem", PROBLEMS)
def test_every_valid_point_compiles(problem):
    valid = KERNEL.space.enumerate(problem, H200).valid
    assert valid, f"no valid point for {problem.describe()}"
    assert_points_compile(KERNEL, problem, valid)


# ---------------------------------------------------------------------------------------------
# PTX


def _count(ptx: str, op: str, qualifier: str, vector: str) -> int:
    """Global accesses `op` (ld or st) with the cache qualifier (".cs" or "") and the vector
    suffix (".v4.b32", ".v2.b32", ".b32")."""
    return len(re.findall(rf"\b{op}\.global{re.escape(qualifier)}{re.escape(vector)}\b", ptx))


@pytest.mark.parametrize(("hints", "qualifier"), [(NORMAL, ""), (STREAMING, ".cs")])
def test_rows_move_in_the_configured_vectors_with_their_hints(hints, qualifier, tmp_path,
                                                              monkeypatch):
    """qwen3-8b's 512 vectors of 128 bits over 8 warps: two a thread, each gathered with the
    hints (the norm's weight plainly), then stored twice with them (residual and out)."""
    ptx = ptx_of(KERNEL, QWEN3_8B, EmbeddingRMSNormConfig(BLOCK_PER_ROW, 128, 8, hints), H200,
                 tmp_path, monkeypatch)
    accesses = {(op, int(count or 1) * int(bits))
                for op, count, bits in GLOBAL_ACCESS.findall(ptx)}
    assert ("ld", 128) in accesses and ("st", 128) in accesses
    assert _count(ptx, "st", qualifier, ".v4.b32") == 4
    if hints == STREAMING:
        assert _count(ptx, "ld", ".cs", ".v4.b32") == 2  # the table's rows
        assert _count(ptx, "st", "", ".v4.b32") == 0
    else:
        assert _count(ptx, "ld", "", ".v4.b32") + len(
            re.findall(r"\bld\.global\.nc\.v4\.b32\b", ptx)) == 4  # rows and weight


def _compares(ptx: str, bits: int, bound: int) -> bool:
    """Whether some setp of `bits`-wide integers compares with the constant `bound` (or
    bound - 1: id < bound is id > bound - 1 too)."""
    return re.search(rf"\bsetp\.\w+\.[su]{bits}\s[^\n]*,\s*({bound}|{bound - 1});",
                     ptx) is not None


def test_int64_ids_are_compared_in_64_bits_and_bad_ones_raise_the_flag(tmp_path, monkeypatch):
    ptx = ptx_of(KERNEL, FP32_2880, EmbeddingRMSNormConfig(BLOCK_PER_ROW, 128, 4, NORMAL), H200,
                 tmp_path, monkeypatch)
    assert re.search(r"\bld\.global(?:\.nc)?\.b64\b", ptx)  # the id
    assert _compares(ptx, 64, FP32_2880.vocab_size)
    assert not _compares(ptx, 32, FP32_2880.vocab_size)
    assert re.search(r"\bst\.global\.b32\s+\[[^\]]+\],\s*1;", ptx)


def _f32_literal(value: float) -> str:
    return "0f" + struct.pack(">f", value).hex().upper()


def test_gemma_s_scale_is_a_compile_time_multiply(tmp_path, monkeypatch):
    """int32 ids compared in 32 bits; 64-bit vectors in a warp per row; the rows multiplied by
    the normaliser (an fp32 literal), which an unscaled problem does not hold."""
    ptx = ptx_of(KERNEL, GEMMA_FP16, EmbeddingRMSNormConfig(WARP_PER_ROW, 64, 4, NORMAL), H200,
                 tmp_path, monkeypatch)
    assert _compares(ptx, 32, GEMMA_FP16.vocab_size)
    assert not _compares(ptx, 64, GEMMA_FP16.vocab_size)
    assert {(op, int(count or 1) * int(bits))
            for op, count, bits in GLOBAL_ACCESS.findall(ptx)} >= {("ld", 64), ("st", 64)}
    assert re.search(rf"\bmul(?:\.rn)?\.f32\s[^\n]*{_f32_literal(GEMMA_SCALE)};", ptx)


def test_an_unscaled_problem_multiplies_by_nothing(tmp_path, monkeypatch):
    unscaled = EmbeddingRMSNormProblem(**{**GEMMA_FP16.static_fields(), "num_tokens": 1,
                                          "embed_scale": 1.0})
    ptx = ptx_of(KERNEL, unscaled, EmbeddingRMSNormConfig(WARP_PER_ROW, 64, 4, NORMAL), H200,
                 tmp_path, monkeypatch)
    assert _f32_literal(GEMMA_SCALE) not in ptx

"""The CI compile checks: the covering points of the embedding space (every pair of knob values,
and the defaults served at every bucket) compile for sm_90a on the CPU for one preset's table
(bf16, int64 ids, the whole vocabulary) and for synthetic problems that take every other code
path: fp16 and fp32 rows, int32 ids, a rank's range inside the vocabulary; and the PTX of a few
points shows the accesses and the compares the problem asks for. The presets differ from the
first problem only in hidden and the vocabulary (compile-time numbers, no other code).

The `sweep` marker compiles every valid point.
"""

import re

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.cache_hints import NORMAL, STREAMING
from cutetune.kernels.embedding import KERNEL, EmbeddingConfig, EmbeddingProblem
from cutetune.spaces.buckets import BUCKETS
from cutetune.spaces.models import PRESETS
from testkit.compile_checks import GLOBAL_ACCESS, assert_points_compile, ptx_of
from testkit.covering_points import covering_configs

H200 = DEVICE_SPECS["H200"]

(QWEN3_8B,) = KERNEL.problems_for_model(PRESETS["qwen3-8b"], "bfloat16")


def _rank(dtype: str, hidden: int, ids_dtype: str) -> EmbeddingProblem:
    """The second of four ranks of a 151936-id vocabulary."""
    return EmbeddingProblem(num_tokens=1, dtype=dtype, hidden=hidden, vocab_size=151936,
                            vocab_start=37984, vocab_end=75968, ids_dtype=ids_dtype)


PROBLEMS = [
    pytest.param(QWEN3_8B, id="qwen3-8b"),
    pytest.param(_rank("float16", 1024, "int32"), id="fp16-int32-rank"),
    pytest.param(_rank("float32", 2880, "int64"), id="fp32-int64-rank"),
]


@pytest.mark.parametrize("problem", PROBLEMS)
def test_covering_points_compile(problem):
    assert_points_compile(KERNEL, problem, covering_configs(KERNEL, problem, H200, BUCKETS))


@pytest.mark.sweep
@pytest.mark.parametrize("problem", PROBLEMS)
def test_every_valid_point_compiles(problem):
    valid = KERNEL.space.enumerate(problem, H200).valid
    assert valid, f"no valid point for {problem.describe()}"
    assert_points_compile(KERNEL, problem, valid)


# ---------------------------------------------------------------------------------------------
# PTX


def _accesses(ptx: str) -> set[tuple[str, int]]:
    """(op, bits) of each global access: ("ld", 128) for ld.global.v4.b32."""
    return {(op, int(count or 1) * int(bits)) for op, count, bits in GLOBAL_ACCESS.findall(ptx)}


@pytest.mark.parametrize(("hints", "qualifier"), [(NORMAL, ""), (STREAMING, ".cs")])
def test_rows_move_in_the_configured_vectors_with_their_hints(hints, qualifier, tmp_path,
                                                              monkeypatch):
    ptx = ptx_of(KERNEL, QWEN3_8B, EmbeddingConfig(128, 2, 4, hints), H200, tmp_path,
                 monkeypatch)
    assert ("ld", 128) in _accesses(ptx) and ("st", 128) in _accesses(ptx)
    assert len(re.findall(rf"\bld\.global{re.escape(qualifier)}\.v4\.b32", ptx)) == 2
    assert len(re.findall(rf"\bst\.global{re.escape(qualifier)}\.v4\.b32", ptx)) == 2


def _compares(ptx: str, bits: int, bound: int) -> bool:
    """Whether some setp of `bits`-wide integers compares with the constant `bound` (or
    bound - 1: id < bound is id > bound - 1 too)."""
    return re.search(rf"\bsetp\.\w+\.[su]{bits}\s[^\n]*,\s*({bound}|{bound - 1});",
                     ptx) is not None


# The end of _rank's range, and the vocabulary.
END, VOCAB = 75968, 151936


def test_int64_ids_are_compared_in_64_bits(tmp_path, monkeypatch):
    """An id of 2^32 + vocab_start must not pass for the rank's first row: the range and
    vocabulary compares of an int64 id are 64-bit, and the flag is raised with a store of 1."""
    ptx = ptx_of(KERNEL, _rank("float32", 2880, "int64"), EmbeddingConfig(128, 1, 1, NORMAL),
                 H200, tmp_path, monkeypatch)
    assert re.search(r"\bld\.global(?:\.nc)?\.b64\b", ptx)  # the id
    assert _compares(ptx, 64, END) and _compares(ptx, 64, VOCAB)
    assert not _compares(ptx, 32, END) and not _compares(ptx, 32, VOCAB)
    assert re.search(r"\bst\.global\.b32\s+\[[^\]]+\],\s*1;", ptx)


def test_int32_ids_are_compared_in_32_bits(tmp_path, monkeypatch):
    """Four 32-bit vectors a thread: four ids loaded before the first row."""
    ptx = ptx_of(KERNEL, _rank("float16", 1024, "int32"), EmbeddingConfig(32, 4, 1, NORMAL),
                 H200, tmp_path, monkeypatch)
    assert _accesses(ptx) == {("ld", 32), ("st", 32)}
    assert _compares(ptx, 32, END) and _compares(ptx, 32, VOCAB)
    assert not _compares(ptx, 64, END)

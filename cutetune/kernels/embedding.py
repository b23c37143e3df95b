"""Token embedding lookup, vocab-parallel: each token's row gathered from this rank's share of
the embedding table.

    out[t] = weight[ids[t] - vocab_start]   where vocab_start <= ids[t] < vocab_end
    out[t] = 0                              otherwise

ids is (tokens,) int32 or int64; weight (rows, hidden) holds this rank's ids [vocab_start,
vocab_end) of a vocabulary of vocab_size (the whole table on one GPU: vocab_start 0, vocab_end
vocab_size), rows = vocab_end - vocab_start, or more where an engine pads its shard (vLLM does):
the padding rows are never read. out is (tokens, hidden) in weight's dtype. A token whose id
another rank holds gets a zero row, so that summing the ranks' outputs (an all-reduce) gives
every token its row. An id outside the whole vocabulary, [0, vocab_size), is an engine's bug:
its row is zero too, and the kernel raises `error` (1,) int32 on the device, as moe_dispatch
flags its bad expert ids; so does an id of the rank's that its table has no row for (fewer rows
than the range), so that no id reads outside the table. The kernel only ever sets the flag,
never clears it, so one flag serves many calls (and CUDA graph replays) without a memset each:
the caller zeroes it when it reads it.

Work split: a row is hidden / VEC vectors; the vectors of all output rows are numbered
row-major and a block takes THREADS * VECTORS_PER_THREAD consecutive numbers, thread `tid` the
numbers tid, tid + THREADS, ..., so each store instruction of a warp is coalesced (and each
load of a row's vectors too). A block may straddle rows, so any hidden that the vector divides
works. The token count, the weight's rows and both row strides are dynamic; the rank's range
and the vocabulary are compile-time (the op's key holds them, not the table's rows). The
config's cache_hints chooses plain or streaming (evict-first) loads of the rows and stores of
out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cutetune.kernels import cache_hints
from cutetune.kernels.block_limits import (
    WARP,
    block_fits_register_file,
    block_size_within_device,
    estimated_registers,
)
from cutetune.kernels.cost import Cost
from cutetune.kernels.dtypes import DTYPE_BYTES, TORCH_DTYPES, vector_elements, widest_vector_bits
from cutetune.kernels.registry import (
    DeviceCompile,
    KernelDef,
    NotApplicableError,
    Tensors,
    VerificationError,
    register,
)
from cutetune.spaces.models import ModelShape
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import Constraint, Param, Space

ID_DTYPES: dict[str, torch.dtype] = {"int32": torch.int32, "int64": torch.int64}
ID_BYTES = {"int32": 4, "int64": 8}
# The seed heuristic gives a thread at least this many bits of rows to load before it waits
# (activation.py's rule: one 128-bit vector, or several narrower ones).
MIN_BITS_PER_THREAD = 128
# make_inputs allocates this many weight rows per token (up to the rank's rows), not the whole
# table: the tuner rotates up to 64 input sets, and 64 copies of a 150k-row table would not fit
# the GPU. With four rows per token most ids are distinct, so a call still reads one row per
# token, cold after the rotation, as it does from the whole table.
INPUT_ROWS_PER_TOKEN = 4
# make_inputs puts two ids outside the vocabulary into calls of at least this many tokens, so
# that the flag is checked both raised (these calls) and left alone (the smaller ones).
BAD_IDS_FROM_TOKENS = 4
# A gather copies bits: nothing but the exact row passes (check below compares exactly).
TOLERANCE = {dtype: (0.0, 0.0) for dtype in TORCH_DTYPES}


@dataclass(frozen=True, kw_only=True)
class EmbeddingProblem(Problem):
    dtype: str
    hidden: int
    vocab_size: int
    # This rank's rows of the vocabulary: [vocab_start, vocab_end).
    vocab_start: int
    vocab_end: int
    ids_dtype: str

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} not supported: use {', '.join(TORCH_DTYPES)}")
        for name in ("hidden", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not (0 <= self.vocab_start < self.vocab_end <= self.vocab_size):
            raise ValueError(f"this rank's rows [{self.vocab_start}, {self.vocab_end}) must be a "
                             f"non-empty range within the vocabulary [0, {self.vocab_size})")
        # The kernel indexes and compares ids in 32 bits once they are in range.
        if self.vocab_size >= 2**31:
            raise ValueError(f"vocab_size {self.vocab_size} must be below 2^31")
        if self.ids_dtype not in ID_DTYPES:
            raise ValueError(f"ids_dtype {self.ids_dtype!r} not supported: use "
                             f"{' or '.join(ID_DTYPES)}")

    @property
    def rows(self) -> int:
        """The rows of this rank's table."""
        return self.vocab_end - self.vocab_start


@dataclass(frozen=True)
class EmbeddingConfig:
    vector_bits: int
    vectors_per_thread: int
    warps_per_block: int
    cache_hints: str


def _vector_elements(problem: EmbeddingProblem, config: EmbeddingConfig) -> int:
    return vector_elements(problem.dtype, config.vector_bits)


def _vectors_per_block(config: EmbeddingConfig) -> int:
    return config.warps_per_block * WARP * config.vectors_per_thread


def _registers_per_thread(problem: EmbeddingProblem, config: EmbeddingConfig) -> int:
    # Each vector's data and its token's id (two registers for int64), held until the stores.
    return estimated_registers(config.vectors_per_thread * (config.vector_bits // 32 + 2))


SPACE = Space(
    config_type=EmbeddingConfig,
    params=(
        Param("vector_bits", (32, 64, 128), "bits per thread per global access of a row"),
        Param("vectors_per_thread", (1, 2, 4),
              "vectors a thread loads before its first store (ILP)"),
        # 1 warp: the decode variant, one small block on each of many SMs; 4-8 warps reach the
        # copy ceiling on large calls (DESIGN.md).
        Param("warps_per_block", (1, 4, 8), "warps in one thread block"),
        cache_hints.CACHE_HINTS_PARAM,
    ),
    constraints=(
        Constraint(
            "hidden_splits_into_vectors",
            "hidden must be a whole number of vectors, so that every row starts on a vector "
            "boundary",
            lambda p, c, d: p.hidden % _vector_elements(p, c) == 0,
        ),
        block_fits_register_file(_registers_per_thread),
        block_size_within_device(),
    ),
)


def default_config(problem: EmbeddingProblem, device) -> EmbeddingConfig:
    """The seed heuristic: the widest vector that divides hidden, as many vectors per thread as
    MIN_BITS_PER_THREAD asks, plain accesses; then the largest block of 8 or 4 warps that still
    gives every SM a block, else one warp per block (decode)."""
    bits = widest_vector_bits(problem.dtype, problem.hidden)
    if not bits:
        # No vector divides hidden: let the space say which constraint removed every point.
        SPACE.valid_points(problem, device)
    per_thread = MIN_BITS_PER_THREAD // bits
    vectors = problem.num_tokens * problem.hidden // vector_elements(problem.dtype, bits)
    threads_needed = math.ceil(vectors / per_thread)
    warps = next((w for w in (8, 4) if threads_needed >= w * WARP * device.sm_count), 1)
    return EmbeddingConfig(bits, per_thread, warps, cache_hints.NORMAL)


def _blocks(problem: EmbeddingProblem, config: EmbeddingConfig) -> int:
    vectors = problem.num_tokens * problem.hidden // _vector_elements(problem, config)
    return math.ceil(vectors / _vectors_per_block(config))


def cost(problem: EmbeddingProblem, config: EmbeddingConfig, device) -> Cost:
    row_bytes = problem.num_tokens * problem.hidden * DTYPE_BYTES[problem.dtype]
    return Cost(
        # The ids read once, a row read per token and out written once. A rank reads only the
        # rows it holds; the roofline assumes every id is its own (one GPU's whole table), the
        # most a call can move.
        bytes_moved=problem.num_tokens * ID_BYTES[problem.ids_dtype] + 2 * row_bytes,
        flops=0,
        blocks=_blocks(problem, config),
        threads_per_block=config.warps_per_block * WARP,
        registers_per_thread=_registers_per_thread(problem, config),
        bytes_in_flight_per_thread=config.vectors_per_thread * config.vector_bits // 8,
    )


# ---------------------------------------------------------------------------------------------
# The launch (the kernel, its launcher and its compile are device/embedding.py)


def launch(compiled, tensors: Tensors) -> None:
    compiled(tensors["ids"], tensors["weight"], tensors["out"], tensors["error"])


# ---------------------------------------------------------------------------------------------
# Reference, check, inputs, model problems


def reference(tensors: Tensors, problem: EmbeddingProblem) -> dict[str, torch.Tensor]:
    """The rank's rows gathered in fp32 (zero for ids it does not hold) and the flag as the
    kernel leaves it: raised where an id lies outside [0, vocab_size) or is the rank's but
    past its table's rows, else as it was."""
    ids = tensors["ids"].to(torch.int64)
    weight = tensors["weight"]
    local = ids - problem.vocab_start
    owned = (local >= 0) & (ids < problem.vocab_end)
    held = owned & (local < weight.shape[0])
    out = torch.where(held[:, None], weight[torch.where(held, local, 0)].float(), 0.0)
    bad = ((ids < 0) | (ids >= problem.vocab_size) | (owned & ~held)).any().to(torch.int32)
    return {"out": out, "error": tensors["error"] | bad}


def check(outputs: Tensors, expected: dict[str, torch.Tensor], problem: EmbeddingProblem) -> None:
    """The flag exactly, and every element of out exactly its row's (a NaN left by an unwritten
    element fails)."""
    if not torch.equal(outputs["error"], expected["error"]):
        raise VerificationError(f"error: got {outputs['error'].tolist()}, expected "
                                f"{expected['error'].tolist()}")
    out = outputs["out"]
    if tuple(out.shape) != tuple(expected["out"].shape):
        raise VerificationError(f"out: shape {tuple(out.shape)}, expected "
                                f"{tuple(expected['out'].shape)}")
    bad = ~(out.float() == expected["out"])
    count = int(bad.sum())
    if count:
        token, column = (int(i) for i in bad.nonzero()[0])
        raise VerificationError(
            f"out: {count} of {out.numel()} elements are not their rows'; first at token "
            f"{token}, column {column}: got {out[token, column].item():.6g}, expected "
            f"{expected['out'][token, column].item():.6g}")


def make_inputs(problem: EmbeddingProblem, device, generator: torch.Generator) -> Tensors:
    """ids drawn as a uniform vocabulary would draw them (the rank's share of them its own,
    the rest another rank's), a table of INPUT_ROWS_PER_TOKEN random rows per token (up to the
    rank's rows; its own ids index those: a table of fewer rows than the range serves them as
    the whole one would), out allocated (the verifier poisons it) and the flag
    zeroed. From BAD_IDS_FROM_TOKENS tokens, two ids lie outside the vocabulary: -1, and
    vocab_size (int32) or 2^32 + vocab_start (int64: read in 32 bits, it would pass for this
    rank's first row)."""
    tokens = problem.num_tokens
    rows = min(problem.rows, INPUT_ROWS_PER_TOKEN * tokens)
    dtype = TORCH_DTYPES[problem.dtype]
    weight = torch.randn(rows, problem.hidden, generator=generator, device=device,
                         dtype=torch.float32).to(dtype)
    own = problem.vocab_start + torch.randint(0, rows, (tokens,), generator=generator,
                                              device=device)
    others = problem.vocab_size - problem.rows
    ids = own
    if others:
        # Numbered past this rank's range: [0, vocab_start) then [vocab_end, vocab_size).
        other = torch.randint(0, others, (tokens,), generator=generator, device=device)
        other = torch.where(other < problem.vocab_start, other, other + problem.rows)
        share = torch.rand(tokens, generator=generator, device=device) * problem.vocab_size
        ids = torch.where(share < problem.rows, own, other)
    if tokens >= BAD_IDS_FROM_TOKENS:
        low, high = torch.randperm(tokens, generator=generator, device=device)[:2].tolist()
        ids[low] = -1
        ids[high] = problem.vocab_size if problem.ids_dtype == "int32" else (
            2**32 + problem.vocab_start)
    return {
        "ids": ids.to(ID_DTYPES[problem.ids_dtype]),
        "weight": weight,
        "out": torch.empty(tokens, problem.hidden, dtype=dtype, device=device),
        "error": torch.zeros(1, dtype=torch.int32, device=device),
    }


def problems_for_model(model: ModelShape, dtype: str) -> list[EmbeddingProblem]:
    """The model's table on one GPU (the whole vocabulary), int64 ids as engines hold them."""
    if model.vocab_size is None:
        raise NotApplicableError(f"model {model.name}'s config states no vocab_size")
    return [EmbeddingProblem(num_tokens=1, dtype=dtype, hidden=model.hidden_size,
                             vocab_size=model.vocab_size, vocab_start=0,
                             vocab_end=model.vocab_size, ids_dtype="int64")]


KERNEL = register(KernelDef(
    name="embedding",
    description="token embedding lookup of this rank's rows (zero rows for other ranks' ids, "
                "ids outside the vocabulary flagged on the device)",
    problem_type=EmbeddingProblem,
    space=SPACE,
    problems_for_model=problems_for_model,
    default_config=default_config,
    cost=cost,
    compile_function=DeviceCompile("cutetune.kernels.device.embedding"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    outputs=("out", "error"),
    written_in_place=("error",),
    tolerance=TOLERANCE,
    source_file=__file__,
    check=check,
))

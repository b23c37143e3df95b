"""The embedding lookup's kernel, launcher and compile, as cutetune.kernels.embedding declares
them."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from cutetune.kernels.block_limits import WARP
from cutetune.kernels.device import cache_hints
from cutetune.kernels.device.compiling import compile_launcher, fake_compact, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES
from cutetune.kernels.embedding import EmbeddingConfig, EmbeddingProblem, _vector_elements

ID_TYPES = {"int32": cutlass.Int32, "int64": cutlass.Int64}


@cute.jit
def id_lookup(token_id, table_rows, START: cutlass.Constexpr[int], END: cutlass.Constexpr[int],
              VOCAB: cutlass.Constexpr[int]):
    """(local, held, bad) of one token's id: its row in this rank's table (id - START); whether
    the table holds that row (the id is the rank's, [START, END), and below the table's rows);
    whether the id is bad (outside the vocabulary [0, VOCAB), or the rank's but past the
    table's rows). The compares are in the id's own width, so an int64 id is never cut to 32
    bits before it is known to be in range."""
    local = token_id - START
    owned = local >= 0 and token_id < END
    held = owned and local < table_rows
    return local, held, token_id < 0 or token_id >= VOCAB or (owned and not held)


@cute.jit
def gather_vector(mW: cute.Tensor, local, held, column, VEC: cutlass.Constexpr[int],
                  HINTS: cutlass.Constexpr[str]):
    """Vector `column` (VEC elements) of row `local` of the table mW in registers, loaded
    with HINTS where `held`, else zeros (another rank's id, or a bad one). A register
    fragment, not a value: a value loaded under the branch would not be seen past it."""
    # The vector's address is only computed where the row is not held, never loaded; the
    # fragment takes its shape, so that its values combine with other vectors of rows.
    vector = cute.zipped_divide(mW[Int32(local), None], (VEC,))[(None, column)]
    fragment = cute.make_rmem_tensor_like(vector)
    fragment.fill(0)
    if held:
        cache_hints.load_into(vector, fragment, HINTS)
    return fragment


@cute.kernel
def _embedding_kernel(mIds: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, mError: cute.Tensor,
                      VEC: cutlass.Constexpr[int], VECTORS_PER_THREAD: cutlass.Constexpr[int],
                      THREADS: cutlass.Constexpr[int], START: cutlass.Constexpr[int],
                      END: cutlass.Constexpr[int], VOCAB: cutlass.Constexpr[int],
                      HINTS: cutlass.Constexpr[str]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    tokens = cute.size(mO, mode=[0])
    vectors_per_row = cute.size(mO, mode=[1]) // VEC
    # The block's first vector as (row, column), split in 64 bits because tokens * hidden / VEC
    # may pass 2^31; each thread's vectors then lie less than one block past it, in 32 bits.
    first = Int64(bidx) * (THREADS * VECTORS_PER_THREAD)
    row0 = Int32(first // vectors_per_row)
    col0 = Int32(first - Int64(row0) * vectors_per_row)
    # Every id first, then every row vector, then the stores, so a thread waits for two memory
    # round trips whatever its count of vectors. A vector past the last token reads the last
    # token's id and stores nothing.
    rows, cols, ids = [], [], []
    for v in cutlass.range_constexpr(VECTORS_PER_THREAD):
        at = col0 + (v * THREADS + tidx)
        rows.append(row0 + at // vectors_per_row)
        cols.append(at % vectors_per_row)
        ids.append(mIds[cutlass.min(rows[v], tokens - 1)])
    table_rows = cute.size(mW, mode=[0])
    fragments, bad = [], []
    for v in cutlass.range_constexpr(VECTORS_PER_THREAD):
        local, held, bad_id = id_lookup(ids[v], table_rows, START, END, VOCAB)
        fragments.append(gather_vector(mW, local, held, cols[v], VEC, HINTS))
        bad.append(bad_id)
    for v in cutlass.range_constexpr(VECTORS_PER_THREAD):
        if rows[v] < tokens:
            tOgO = cute.zipped_divide(mO[rows[v], None], (VEC,))
            cache_hints.store_from(fragments[v], tOgO[(None, cols[v])], HINTS)
            # One thread per bad token raises the flag; racing stores all write 1, and no
            # thread clears it (the caller does).
            if cols[v] == 0 and bad[v]:
                mError[0] = Int32(1)


@cute.jit
def _embedding_launch(mIds: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, mError: cute.Tensor,
                      stream: cuda.CUstream, VEC: cutlass.Constexpr[int],
                      VECTORS_PER_THREAD: cutlass.Constexpr[int], WARPS: cutlass.Constexpr[int],
                      START: cutlass.Constexpr[int], END: cutlass.Constexpr[int],
                      VOCAB: cutlass.Constexpr[int], HINTS: cutlass.Constexpr[str]):
    threads = WARPS * WARP
    per_block = threads * VECTORS_PER_THREAD
    vectors = Int64(cute.size(mO, mode=[0])) * (cute.size(mO, mode=[1]) // VEC)
    blocks = Int32((vectors + per_block - 1) // per_block)
    _embedding_kernel(mIds, mW, mO, mError, VEC, VECTORS_PER_THREAD, threads, START, END, VOCAB,
                      HINTS).launch(grid=(blocks, 1, 1), block=(threads, 1, 1), stream=stream)


def compile_kernel(problem: EmbeddingProblem, config: EmbeddingConfig, options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU) from fake tensors: the
    token count, the weight's rows and both row strides are symbolic, so the result serves
    every call (and make_inputs' tables of fewer rows than the rank holds)."""
    dtype = CUTLASS_DTYPES[problem.dtype]
    vec = _vector_elements(problem, config)
    tokens = cute.sym_int()
    id_type = ID_TYPES[problem.ids_dtype]
    ids = fake_compact(id_type, (tokens,), assumed_align=id_type.width // 8)
    weight = fake_rows(dtype, cute.sym_int(), (problem.hidden,), vec, assumed_align=16)
    out = fake_rows(dtype, tokens, (problem.hidden,), vec, assumed_align=16)
    error = fake_compact(cutlass.Int32, (1,), assumed_align=4)
    return compile_launcher(
        _embedding_launch, (ids, weight, out, error),
        (vec, config.vectors_per_thread, config.warps_per_block, problem.vocab_start,
         problem.vocab_end, problem.vocab_size, config.cache_hints),
        options)

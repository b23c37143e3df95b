"""How every kernel compiles its launcher: from fake tensors, so a compile needs no GPU and no
real data, for TVM-FFI's low-overhead calls on the caller's current stream.

A launcher takes its tensors, then the stream, then its compile-time constants. The token count
(and any other count a call decides, such as a buffer's rows) is a symbolic extent shared by the
tensors that have it, and a row stride is symbolic too, so one compile serves every call of a
static problem.
"""

from __future__ import annotations

from collections.abc import Sequence

import cutlass.cute as cute


def fake_rows(dtype, rows, row_shape: tuple[int, ...], vec: int, assumed_align: int):
    """A fake (rows, *row_shape) tensor of `dtype` (a cutlass type) whose row stride is
    symbolic: 64-bit, since rows * stride may pass 2^31, and a multiple of `vec` elements, so
    every row starts on a vector boundary and the accesses stay vec elements wide. Within a row
    the tensor is compact and row-major; its start is aligned to assumed_align bytes. `rows`
    is an int or a symbolic extent (cute.sym_int()) that the tensors of one call share."""
    return cute.runtime.make_fake_tensor(
        dtype, (rows, *row_shape),
        (cute.sym_int64(divisibility=vec), *_row_major_strides(row_shape)),
        assumed_align=assumed_align)


def fake_compact(dtype, shape: tuple, assumed_align: int):
    """A fake compact row-major tensor, as torch holds a contiguous one (CuTe's compact fake
    tensors are column-major); its leading extent may be symbolic."""
    return cute.runtime.make_fake_tensor(dtype, shape, _row_major_strides(shape),
                                         assumed_align=assumed_align)


def compile_launcher(launcher, tensors: Sequence, constants: Sequence, options: str = ""):
    """cute.compile of launcher(*tensors, stream, *constants) for TVM-FFI: the stream is
    TVM-FFI's environment stream (torch's current stream at each call), so a call passes the
    tensors only. `options`: more compile options (such as --keep-ptx)."""
    return cute.compile(launcher, *tensors,
                        cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), *constants,
                        options=" ".join(("--enable-tvm-ffi", options)).strip())


def _row_major_strides(shape: tuple) -> tuple[int, ...]:
    """The strides of a compact row-major tensor of `shape` (the leading extent is not used)."""
    strides = (1,)
    for extent in reversed(shape[1:]):
        strides = (extent * strides[0], *strides)
    return strides

"""The cache-hinted global loads and stores of cache_hints.py's knob, in CuTeDSL."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.base_dsl.array import L1EvictKind
from cutlass.experimental.primitives.nvvm_wrapper import load_ext

from cutetune.kernels.cache_hints import EVICT_LAST_LOADS, NORMAL, STREAMING, loads_with

# createpolicy.fractional.L2::evict_last.b64 with fraction 1.0.
L2_EVICT_LAST_POLICY = 0x14F0000000000000


def load(src: cute.Tensor, hints: str):
    """src (one vector of global memory) loaded into registers with the given hints."""
    if hints == NORMAL:
        return src.load()
    if hints == EVICT_LAST_LOADS:
        return _load_evict_last(src)
    registers = cute.make_rmem_tensor_like(src)
    load_into(src, registers, hints)
    return registers.load()


def _load_evict_last(src: cute.Tensor):
    """One ld.global.L1::evict_last.L2::cache_hint of the vector's 32-bit words (the copy atoms
    take no L2 policy), reinterpreted as the vector's elements (see loads_with)."""
    bits = cute.size(src) * src.element_type.width
    if not loads_with(EVICT_LAST_LOADS, bits):
        raise ValueError(f"evict_last_loads loads whole 32-bit words: a {bits}-bit vector is "
                         "not one")
    words = bits // 32
    loaded = load_ext(cute.recast_ptr(src.iterator, dtype=cutlass.Int32), dtype=cutlass.Int32,
                      count=words if words > 1 else None,
                      l2_cache_hint=cutlass.Int64(L2_EVICT_LAST_POLICY), evict=L1EvictKind.LAST)
    registers = cute.make_rmem_tensor_like(src)
    as_words = cute.recast_tensor(registers, cutlass.Int32)
    for i in range(words):
        as_words[i] = loaded[i] if words > 1 else loaded
    return registers.load()


def store(dst: cute.Tensor, value, hints: str) -> None:
    """value (a register vector of dst's element type) stored to dst (one vector of global
    memory) with the given hints."""
    if hints != STREAMING:
        dst.store(value)
        return
    registers = cute.make_rmem_tensor_like(dst)
    registers.store(value)
    store_from(registers, dst, hints)


def load_into(src: cute.Tensor, fragment: cute.Tensor, hints: str) -> None:
    """src (one vector of global memory) copied into `fragment` (registers of as many elements,
    in any shape), with normal or streaming hints: for kernels that keep register fragments
    rather than values (a value stored under two branches trips the tracer)."""
    if hints == NORMAL:
        cute.autovec_copy(src, fragment)
        return
    _require_streaming(hints)
    # The copy atom wants the source's shape.
    registers = cute.make_tensor(fragment.iterator, cute.make_layout(cute.shape(src)))
    atom = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), src.element_type,
                               num_bits_per_copy=cute.size(src) * src.element_type.width,
                               load_cache_mode=cute.nvgpu.LoadCacheMode.STREAMING)
    cute.copy(atom, src, registers)


def store_from(fragment: cute.Tensor, dst: cute.Tensor, hints: str) -> None:
    """`fragment` (registers, as load_into fills them) stored to dst (one vector of global
    memory) with normal or streaming hints."""
    if hints == NORMAL:
        cute.autovec_copy(fragment, dst)
        return
    _require_streaming(hints)
    registers = cute.make_tensor(fragment.iterator, cute.make_layout(cute.shape(dst)))
    atom = cute.make_copy_atom(cute.nvgpu.CopyR2GOp(), dst.element_type,
                               num_bits_per_copy=cute.size(dst) * dst.element_type.width,
                               store_cache_mode=cute.nvgpu.StoreCacheMode.STREAMING)
    cute.copy(atom, registers, dst)


def _require_streaming(hints: str) -> None:
    if hints != STREAMING:
        raise ValueError(f"register fragments are copied with {NORMAL!r} or {STREAMING!r} "
                         f"hints, not {hints!r}")

"""Cache hints on a kernel's global loads and stores, as a config knob the tuner sets.

"normal" issues plain ld.global / st.global. "streaming" issues ld.global.cs and st.global.cs
(PTX "cache streaming, likely accessed once": the lines are allocated evict-first in L1 and L2),
for kernels that read each input byte once and write each output byte once. Whether it pays
depends on the shape, so it is a point of the space, not a constant. On the H200 (bf16
silu_and_mul, timed as `cutetune bench` times: rotated inputs, outputs allocated per call):
I = 6144 at 512 tokens, 5.62 us streaming against 5.82 plain (64-bit vectors, 4 warps); I =
14336 at 4096 tokens, 82.44 against 82.82 (128-bit, 8 warps). Streaming loads with plain stores
were slower at the larger size (86.42 us), so the knob sets both together.
"""

from __future__ import annotations

import cutlass.cute as cute

from cutetune.spaces.space import Param

NORMAL, STREAMING = "normal", "streaming"
CACHE_HINTS = (NORMAL, STREAMING)

CACHE_HINTS_PARAM = Param(
    "cache_hints", CACHE_HINTS,
    "normal: plain global loads and stores; streaming: ld.global.cs / st.global.cs, each "
    "line allocated evict-first (read-once inputs, write-once outputs)")


def load(src: cute.Tensor, hints: str):
    """src (one vector of global memory) loaded into registers with the given hints."""
    if hints == NORMAL:
        return src.load()
    atom = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), src.element_type,
                               num_bits_per_copy=cute.size(src) * src.element_type.width,
                               load_cache_mode=cute.nvgpu.LoadCacheMode.STREAMING)
    registers = cute.make_rmem_tensor_like(src)
    cute.copy(atom, src, registers)
    return registers.load()


def store(dst: cute.Tensor, value, hints: str) -> None:
    """value (a register vector of dst's element type) stored to dst (one vector of global
    memory) with the given hints."""
    if hints == NORMAL:
        dst.store(value)
        return
    atom = cute.make_copy_atom(cute.nvgpu.CopyR2GOp(), dst.element_type,
                               num_bits_per_copy=cute.size(dst) * dst.element_type.width,
                               store_cache_mode=cute.nvgpu.StoreCacheMode.STREAMING)
    registers = cute.make_rmem_tensor_like(dst)
    registers.store(value)
    cute.copy(atom, registers, dst)

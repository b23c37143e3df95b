"""Cache hints on a kernel's global loads and stores, as a config knob the tuner sets.

"normal" issues plain ld.global / st.global. "streaming" issues ld.global.cs and st.global.cs
(PTX "cache streaming, likely accessed once": the lines are allocated evict-first in L1 and L2),
for kernels that read each input byte once and write each output byte once. Whether it pays
depends on the shape, so it is a point of the space, not a constant (measured on the H200 for
silu_and_mul and for moe_dispatch's split copy: docs/performance-notes.md).
The knob sets loads and stores together: where streaming both pays, streaming either alone
measures slower than plain accesses.

"evict_last_loads" loads with ld.global.L1::evict_last.L2::cache_hint under an L2 evict_last
policy (the createpolicy.fractional value of fraction 1.0, as CUTLASS's CacheHintSm90 spells
it) and stores plainly, as Inductor's Triton kernel loads a row on its first pass. For the
fused-add RMSNorm on calls that move many times the L2 it beats plain and streaming accesses
and draws level with torch.compile's Inductor kernel (measured on the H200:
docs/performance-notes.md, RMSNorm). A kernel offers it (cache_hints_param) only where it is
measured. The accesses themselves are device/cache_hints.py.
"""

from __future__ import annotations

from cutetune.spaces.space import Param

NORMAL, STREAMING, EVICT_LAST_LOADS = "normal", "streaming", "evict_last_loads"
CACHE_HINTS = (NORMAL, STREAMING)

_DESCRIPTIONS = {
    NORMAL: "plain global loads and stores",
    STREAMING: "ld.global.cs / st.global.cs, each line allocated evict-first (read-once "
               "inputs, write-once outputs)",
    EVICT_LAST_LOADS: "loads under L1 and L2 evict_last policies, plain stores",
}


def cache_hints_param(values: tuple[str, ...]) -> Param:
    return Param("cache_hints", values,
                 "; ".join(f"{value}: {_DESCRIPTIONS[value]}" for value in values))


CACHE_HINTS_PARAM = cache_hints_param(CACHE_HINTS)


def loads_with(hints: str, load_bits: int) -> bool:
    """Whether `hints` can load a vector of load_bits: evict_last_loads loads whole 32-bit
    words (a single 16-bit element would need a 16-bit load, which no GPU test has run). A
    kernel offering that hint rejects the other points by a constraint of its space."""
    return hints != EVICT_LAST_LOADS or load_bits % 32 == 0

"""The device side of a test-only kernel that misbehaves on request, for the tuner's fault tests.

    out = 2 * x        x, out: (rows, 1024) float32, rows dynamic

One block per row, one thread per element. `behaviour` (compile-time) picks the fault:

    ok             out = 2 * x, `passes` times over (so ok points differ in speed)
    compile_error  cute.compile raises a DSL error while tracing the launcher
    wrong          out = 2 * x + 1
    nan            out = NaN
    trap           the kernel executes PTX `trap;`: the launch ends in a sticky CUDA error
    spin           the kernel never finishes (a nanosleep loop)
    slow           out = 2 * x, but about 20x slower than ok at 1 pass for a small call

Every behaviour that runs to its end makes `passes` passes; each loads x and stores out with
volatile accesses (LDG/STG.E.STRONG.SYS), which no compiler stage may merge, drop or reorder, so
each pass adds a memory round trip (its load issues after the previous pass's store, which
waits for that pass's load) and 1 pass is the fastest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass._mlir.dialects import llvm
from cutlass.base_dsl.common import DSLUserCodeError
from cutlass.experimental.primitives.nvvm_wrapper import MemOrder, load_ext, store_ext

BEHAVIOURS = ("ok", "compile_error", "wrong", "nan", "trap", "spin", "slow")
COLUMNS = 1024
# slow adds a zero the compiler cannot see (0 * x) to the result this many times, a chain of
# dependent fp32 adds (FFMAs in the SASS) of about 4 cycles each on Hopper: a small call (up to
# about 64 rows, where every thread runs its chain at once) should take ~40 us more, some 20x
# ok's ~2 us; a large one is bound by add throughput and is slower still against ok. (Estimated
# from latencies, not timed.)
SLOW_ADDS = 20_000
# Inline PTX. ${:uid} is LLVM's number for each asm statement it emits, so the label stays
# unique if the statement is ever duplicated (unrolled, inlined twice). nanosleep keeps the
# spinning warps from hogging issue slots, and being an instruction with an effect, it stops
# ptxas from deleting the loop (the SASS keeps NANOSLEEP and a BRA back to it).
_TRAP_PTX = "trap;"
_SPIN_PTX = "{\n\tspin_${:uid}:\n\tnanosleep.u32 1000;\n\tbra.uni spin_${:uid};\n\t}"


def _inline_ptx(asm: str) -> None:
    # has_side_effects: neither LLVM nor the DSL may drop or hoist a statement with no result.
    llvm.inline_asm(None, [], asm, "~{memory}", has_side_effects=True,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@cute.kernel
def _fault_kernel(mX: cute.Tensor, mO: cute.Tensor, BEHAVIOUR: cutlass.Constexpr[str],
                  PASSES: cutlass.Constexpr[int]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    if cutlass.const_expr(BEHAVIOUR == "trap"):
        _inline_ptx(_TRAP_PTX)
    if cutlass.const_expr(BEHAVIOUR == "spin"):
        _inline_ptx(_SPIN_PTX)
    x_ptr = mX.iterator + cute.crd2idx((bidx, tidx), mX.layout)
    out_ptr = mO.iterator + cute.crd2idx((bidx, tidx), mO.layout)
    for _ in cutlass.range_constexpr(PASSES):
        x = load_ext(x_ptr, order=MemOrder.VOLATILE)
        y = x * Float32(2.0)
        if cutlass.const_expr(BEHAVIOUR == "wrong"):
            y = y + Float32(1.0)
        if cutlass.const_expr(BEHAVIOUR == "nan"):
            y = Float32(float("nan"))
        if cutlass.const_expr(BEHAVIOUR == "slow"):
            # 0 * x is a zero of x's sign for finite x, so 2x + 0x is exactly 2x (-0 too);
            # IEEE forbids folding either (x may be inf or NaN). A dynamic loop: small code.
            zero = x * Float32(0.0)
            for _ in cutlass.range(SLOW_ADDS):
                y = y + zero
        store_ext(y, out_ptr, order=MemOrder.VOLATILE)


@cute.jit
def _fault_launch(mX: cute.Tensor, mO: cute.Tensor, stream: cuda.CUstream,
                  BEHAVIOUR: cutlass.Constexpr[str], PASSES: cutlass.Constexpr[int]):
    if cutlass.const_expr(BEHAVIOUR == "compile_error"):
        # Raised while tracing, as a real kernel's trace-time check fails.
        # DSLUserCodeError rather than DSLRuntimeError: the latter renders as "an internal DSL
        # problem", and that banner, not this message, would be the error's first line.
        raise DSLUserCodeError("injected compile failure (fault kernel behaviour "
                               "'compile_error')")
    _fault_kernel(mX, mO, BEHAVIOUR, PASSES).launch(
        grid=(cute.size(mX, mode=[0]), 1, 1), block=(COLUMNS, 1, 1), stream=stream)


def compile_fault_kernel(behaviour: str, passes: int, options: str = ""):
    """Compile for the target in CUTE_DSL_ARCH (or the visible GPU); the row count is
    symbolic, so the result serves every (rows, 1024) float32 x and out."""
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"behaviour must be one of {BEHAVIOURS}, got {behaviour!r}")
    if not isinstance(passes, int) or passes < 1:
        raise ValueError(f"passes must be a positive integer, got {passes!r}")
    rows = cute.sym_int()

    def matrix():
        return cute.runtime.make_fake_compact_tensor(Float32, (rows, COLUMNS),
                                                     stride_order=(1, 0), assumed_align=16)

    return cute.compile(
        _fault_launch, matrix(), matrix(),
        cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True), behaviour, passes,
        options=" ".join(("--enable-tvm-ffi", options)).strip(),
    )


def launch(compiled, tensors: Mapping[str, Any]) -> None:
    compiled(tensors["x"], tensors["out"])

"""mxfp8_quant's and nvfp4_quant's kernel, launcher and compile, as cutetune.kernels.block_quant
declares them: one body, the format, the scales' layout and the target's conversions chosen at
compile time.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.base_dsl import Arch
from cutlass.cutlass_dsl import CuTeDSL, T, dsl_user_op
from cutlass.experimental.primitives.nvvm_wrapper import load_ext

from cutetune.kernels import scale_layout
from cutetune.kernels.block_limits import WARP
from cutetune.kernels.block_quant import (
    E2M1_MAX,
    E4M3_EMAX,
    E8M0_BIAS,
    E8M0_NAN,
    MXFP8,
    NVFP4,
    PACKING,
    BlockQuantConfig,
    BlockQuantProblem,
    lanes_per_block,
    vector_elements,
)
from cutetune.kernels.device.compiling import compile_launcher, fake_compact, fake_rows
from cutetune.kernels.device.dtypes import CUTLASS_DTYPES

VALUE_TYPES = {MXFP8: cutlass.Float8E4M3FN, NVFP4: cutlass.Float4E2M1FNx2}
SCALE_TYPES = {MXFP8: cutlass.Float8E8M0FNU, NVFP4: cutlass.Float8E4M3FN}
ABS_MASK = 0x7FFFFFFF
INFINITY_BITS = 0x7F800000
FLOAT_MANTISSA_BITS = 23
# sm_90a's e2m1 rounding (see _e2m1_magnitude), on fp32 patterns: 1.0's, and that of 2^23
# (whose ulp is 1) less twice 1.0's exponent field, so that adding twice a value's exponent
# field gives 2^23 plus twice its unbiased exponent.
ONE_BITS = 127 << FLOAT_MANTISSA_BITS
CODE_ORIGIN_BITS = ((127 + 23) << FLOAT_MANTISSA_BITS) - 2 * 127
E2M1_MAGNITUDE_MASK = 0x7
WIDE_BITS = 256


def has_e2m1_conversion() -> bool:
    """Whether the compile's target has cvt.rn.satfinite.e2m1x2.f32: the arch-specific (a) and
    family (f) targets from sm_100 on (the plain sm_100, sm_120, ... lack it). Read while a
    kernel is traced, from the compile's --gpu-arch or CUTE_DSL_ARCH."""
    arch = CuTeDSL._get_dsl().get_arch_enum()
    return arch >= Arch.sm_100a and arch.name.endswith(("a", "f"))


@dsl_user_op
def _bits(value: Float32, *, loc=None, ip=None) -> Int32:
    return Int32(llvm.bitcast(T.i32(), Float32(value).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def _float(bits: Int32, *, loc=None, ip=None) -> Float32:
    return Float32(llvm.bitcast(T.f32(), Int32(bits).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def _e4m3(value: Float32, *, loc=None, ip=None) -> Int32:
    """The e4m3 byte of `value`: cvt.rn.satfinite (nearest even, saturating to +-448, NaN kept),
    in the low 8 bits."""
    return Int32(llvm.inline_asm(
        T.i32(), [Float32(value).ir_value(loc=loc, ip=ip)],
        "{ .reg .b16 h; cvt.rn.satfinite.e4m3x2.f32 h, $1, $1; cvt.u32.u16 $0, h; }",
        "=r,f", loc=loc, ip=ip)) & 0xFF


@dsl_user_op
def _e4m3_value(byte: Int32, *, loc=None, ip=None) -> Float32:
    """The fp32 value of an e4m3 byte (exact: through f16, which holds every e4m3 value)."""
    return Float32(llvm.inline_asm(
        T.f32(), [Int32(byte).ir_value(loc=loc, ip=ip)],
        "{ .reg .b16 h, l; .reg .b32 r; cvt.u16.u32 h, $1; cvt.rn.f16x2.e4m3x2 r, h; "
        "mov.b32 {l, h}, r; cvt.f32.f16 $0, l; }",
        "=f,r", loc=loc, ip=ip))


@dsl_user_op
def _e2m1x2_hardware(low: Float32, high: Float32, *, loc=None, ip=None) -> Int32:
    """low and high as e2m1 (nearest even, saturating), low in bits 0-3, high in bits 4-7."""
    return Int32(llvm.inline_asm(
        T.i32(), [Float32(high).ir_value(loc=loc, ip=ip), Float32(low).ir_value(loc=loc, ip=ip)],
        "{ .reg .b8 t; cvt.rn.satfinite.e2m1x2.f32 t, $1, $2; cvt.u32.u8 $0, t; }",
        "=r,f,f", loc=loc, ip=ip))


def _e2m1_magnitude(value: Float32) -> Int32:
    """The e2m1 code of |value| (no NaN), nearest even and saturating as the hardware's
    conversion, in the low 3 bits of the result (the bits above are 2^23's pattern). Below 2
    e2m1 steps by 0.5, from 2 to 4 by 1, from 4 to 6 by 2, and the code of |value| clamped to
    6 is |value| / step + 2E, E = max(0, floor(log2 |value|)), rounded to an integer. One fma
    with 2^23 + 2E does all of it: 2^23's ulp is 1, so its single rounding is the integer
    rounding, nearest even, and 1 / step = 2^(1 - E) and 2E come from the exponent field of
    max(|value|, 1). Bit-exact to the reference on every fp32 pattern (an exhaustive check on
    the CPU), and six SASS instructions an element fewer than rounding the pattern in integers
    (docs/performance-notes.md)."""
    magnitude = cute.arch.fmin(cute.math.abs(value), Float32(E2M1_MAX))
    exponent = cutlass.max(_bits(magnitude) & INFINITY_BITS, Int32(ONE_BITS))
    inverse_step = _float(INFINITY_BITS - exponent)
    origin = _float(CODE_ORIGIN_BITS + (exponent >> (FLOAT_MANTISSA_BITS - 1)))
    return _bits(cute.math.fma(magnitude, inverse_step, origin))


def _e2m1x2_software(low: Float32, high: Float32) -> Int32:
    """low and high as e2m1 (nearest even, saturating), low in bits 0-3, high in bits 4-7: the
    magnitudes' codes, and each sign bit (bit 31) moved to its code's bit 3."""
    codes = (_e2m1_magnitude(low) & E2M1_MAGNITUDE_MASK) | (
        (_e2m1_magnitude(high) & E2M1_MAGNITUDE_MASK) << 4)
    return codes | ((_bits(low) >> 28) & 0x8) | ((_bits(high) >> 24) & 0x80)


def _e2m1x2(low: Float32, high: Float32, HARDWARE: bool) -> Int32:
    if HARDWARE:
        return _e2m1x2_hardware(low, high)
    return _e2m1x2_software(low, high)


def _load(src: cute.Tensor, VEC_BITS: int):
    """One vector of x (global memory) loaded into registers: a 256-bit vector by one
    ld.global.v8.b32 (the DSL's own copy splits it into two 128-bit loads)."""
    if VEC_BITS < WIDE_BITS:
        return src.load()
    words = WIDE_BITS // 32
    loaded = load_ext(cute.recast_ptr(src.iterator, dtype=Int32), dtype=Int32, count=words)
    registers = cute.make_rmem_tensor_like(src)
    as_words = cute.recast_tensor(registers, Int32)
    for i in range(words):
        as_words[i] = loaded[i]
    return registers.load()


def _block_amax_bits(bits: list, LANES: int) -> Int32:
    """The largest |x| of the quantisation block, as an fp32 bit pattern: the max of this
    thread's patterns with the sign cleared (non-negative floats order as their patterns, and
    a NaN's pattern lies above infinity's, so a NaN wins), over the block's LANES lanes by
    butterfly shuffles."""
    amax = Int32(0)
    for b in bits:
        amax = cutlass.max(amax, b & ABS_MASK)
    for i in range(LANES.bit_length() - 1):
        amax = cutlass.max(amax, cute.arch.shuffle_sync_bfly(amax, offset=LANES >> (i + 1)))
    return amax


@cute.jit
def _quantise_vector(mX: cute.Tensor, mQ: cute.Tensor, mScales: cute.Tensor,
                     global_scale: Float32, row: Int32, vector: Int32, x_values,
                     VEC: cutlass.Constexpr[int], LANES: cutlass.Constexpr[int],
                     COLUMNS: cutlass.Constexpr[int], FORMAT: cutlass.Constexpr[str],
                     SWIZZLED: cutlass.Constexpr[bool],
                     HARDWARE: cutlass.Constexpr[bool]):
    """Vector `vector` of row `row` (loaded: x_values, fp32) quantised and stored, with its
    block's scale where this lane is the block's first. Every lane of the warp calls this (the
    shuffles); a row past the last stores nothing."""
    tokens = cute.size(mX, mode=[0])
    bits = []
    for i in cutlass.range_constexpr(VEC):
        bits.append(_bits(x_values[i]))
    amax_bits = _block_amax_bits(bits, LANES)
    nan = amax_bits > INFINITY_BITS
    # A NaN block's elements are +0 (the module docstring says why).
    keep = Int32(cutlass.select_(nan, Int32(0), Int32(-1)))
    scale_byte = Int32(0)
    multiplier = Float32(0.0)
    if cutlass.const_expr(FORMAT == MXFP8):
        exponent = (amax_bits >> FLOAT_MANTISSA_BITS) - E8M0_BIAS - E4M3_EMAX
        shared = cutlass.min(cutlass.max(exponent, -E8M0_BIAS), E8M0_BIAS)
        scale_byte = Int32(cutlass.select_(nan, Int32(E8M0_NAN), shared + E8M0_BIAS))
        # 2^-shared, never denormal (shared lies in [-127, 120]).
        multiplier = _float((E8M0_BIAS - shared) << FLOAT_MANTISSA_BITS)
    else:
        scale_byte = _e4m3((_float(amax_bits) / E2M1_MAX) * global_scale)
        scale = _e4m3_value(scale_byte)
        # Zero and NaN scales (a NaN block's) leave the multiplier 0.
        if scale > 0.0:
            multiplier = global_scale / scale
    if row < tokens:
        # Non-negative: unsigned, so that // and % by powers of two are shifts and masks.
        block = Uint32(vector) // LANES
        if Uint32(vector) % LANES == 0:
            _store_scale(mScales, Uint32(row), block, scale_byte, COLUMNS, SWIZZLED)
        y = []
        for i in cutlass.range_constexpr(VEC):
            y.append(_float(bits[i] & keep) * multiplier)
        if cutlass.const_expr(FORMAT == MXFP8):
            fragment = cute.make_rmem_tensor((VEC,), Float32)
            for i in cutlass.range_constexpr(VEC):
                fragment[i] = y[i]
            tQgQ = cute.zipped_divide(mQ[row, None], (VEC,))
            tQgQ[(None, vector)].store(fragment.load().to(mQ.element_type))
        else:
            packed = cute.make_rmem_tensor((VEC // 2,), Uint8)
            for i in cutlass.range_constexpr(VEC // 2):
                packed[i] = Uint8(_e2m1x2(y[2 * i], y[2 * i + 1], HARDWARE))
            bytes_row = cute.recast_tensor(mQ[row, None], Uint8)
            tQgQ = cute.zipped_divide(bytes_row, (VEC // 2,))
            cute.autovec_copy(packed, tQgQ[(None, vector)])


@cute.jit
def _store_scale(mScales: cute.Tensor, row: Uint32, block: Uint32, scale_byte: Int32,
                 COLUMNS: cutlass.Constexpr[int], SWIZZLED: cutlass.Constexpr[bool]):
    """The scale of (row, block); in the swizzled layout, after a row's last block, the zeros
    of its padded columns too."""
    if cutlass.const_expr(SWIZZLED):
        # The padded rows are the scale tensor's own extent, which the launch does not tie
        # to the token count: rows beyond it are not written.
        if row < cute.size(mScales, mode=[0]):
            padded_columns = cute.size(mScales, mode=[1])
            flat = _flat_bytes(mScales)
            flat[scale_layout.swizzled_offset(row, block, padded_columns)] = Uint8(scale_byte)
            if cutlass.const_expr(COLUMNS % scale_layout.TILE_COLUMNS != 0):
                if block == COLUMNS - 1:
                    for column in cutlass.range_constexpr(COLUMNS, scale_layout.round_up(
                            COLUMNS, scale_layout.TILE_COLUMNS)):
                        flat[scale_layout.swizzled_offset(row, column, padded_columns)] = (
                            Uint8(0))
    else:
        cute.recast_tensor(mScales, Uint8)[row, block] = Uint8(scale_byte)


def _flat_bytes(mScales: cute.Tensor) -> cute.Tensor:
    """The swizzled scales as one run of bytes (the tensor is compact)."""
    return cute.make_tensor(cute.recast_ptr(mScales.iterator, dtype=Uint8),
                            cute.make_layout(cute.size(mScales)))


@cute.jit
def _zero_padding(mX: cute.Tensor, mScales: cute.Tensor, first: Int64,
                  THREADS: cutlass.Constexpr[int], WORDS_PER_THREAD: cutlass.Constexpr[int]):
    """Zero words first + tid, first + tid + THREADS, ... of the swizzled scales' padded rows:
    word w is padded row tokens + w // tiles, the 4 scales of tile column w % tiles (4
    contiguous bytes, so one 32-bit store)."""
    tidx, _, _ = cute.arch.thread_idx()
    tokens = cute.size(mX, mode=[0])
    padded_rows = cute.size(mScales, mode=[0])
    padded_columns = cute.size(mScales, mode=[1])
    tiles = padded_columns // scale_layout.TILE_COLUMNS
    words = cute.make_tensor(cute.recast_ptr(mScales.iterator, dtype=Uint32),
                             cute.make_layout(cute.size(mScales) // 4))
    for v in cutlass.range_constexpr(WORDS_PER_THREAD):
        word = Int32(first) + v * THREADS + tidx
        row = tokens + word // tiles
        if row < padded_rows:
            offset = scale_layout.swizzled_offset(row, (word % tiles) * scale_layout.TILE_COLUMNS,
                                                  padded_columns)
            words[offset // 4] = Uint32(0)


@cute.kernel
def _block_quant_kernel(mX: cute.Tensor, mGlobalScale: cute.Tensor, mQ: cute.Tensor,
                        mScales: cute.Tensor, data_blocks: Int32, VEC: cutlass.Constexpr[int],
                        VECTORS_PER_THREAD: cutlass.Constexpr[int],
                        THREADS: cutlass.Constexpr[int], LANES: cutlass.Constexpr[int],
                        COLUMNS: cutlass.Constexpr[int], FORMAT: cutlass.Constexpr[str],
                        SWIZZLED: cutlass.Constexpr[bool], HARDWARE: cutlass.Constexpr[bool]):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    if bidx < data_blocks:
        tokens = cute.size(mX, mode=[0])
        vectors_per_row = cute.size(mX, mode=[1]) // VEC
        # The block's first vector as (row, column), split in 64 bits as activation's is.
        first = Int64(bidx) * (THREADS * VECTORS_PER_THREAD)
        row0 = Int32(first // vectors_per_row)
        col0 = Int32(first - Int64(row0) * vectors_per_row)
        # Every load first, then the reductions and stores: one memory round trip. A vector
        # past the last row loads the last row instead (its lanes still shuffle).
        rows, cols, values = [], [], []
        for v in cutlass.range_constexpr(VECTORS_PER_THREAD):
            at = Uint32(col0 + (v * THREADS + tidx))
            row = row0 + Int32(at // vectors_per_row)
            col = Int32(at % vectors_per_row)
            tXgX = cute.zipped_divide(mX[cutlass.min(row, tokens - 1), None], (VEC,))
            values.append(_load(tXgX[(None, col)], VEC * mX.element_type.width).to(Float32))
            rows.append(row)
            cols.append(col)
        global_scale = Float32(1.0)
        if cutlass.const_expr(FORMAT == NVFP4):
            global_scale = mGlobalScale[0]
        for v in cutlass.range_constexpr(VECTORS_PER_THREAD):
            _quantise_vector(mX, mQ, mScales, global_scale, rows[v], cols[v], values[v], VEC,
                             LANES, COLUMNS, FORMAT, SWIZZLED, HARDWARE)
    else:
        if cutlass.const_expr(SWIZZLED):
            _zero_padding(mX, mScales, Int64(bidx - data_blocks) * (THREADS * VECTORS_PER_THREAD),
                          THREADS, VECTORS_PER_THREAD)


@cute.jit
def _launch(mX: cute.Tensor, mGlobalScale: cute.Tensor, mQ: cute.Tensor, mScales: cute.Tensor,
            stream: cuda.CUstream, VEC: cutlass.Constexpr[int],
            VECTORS_PER_THREAD: cutlass.Constexpr[int], WARPS: cutlass.Constexpr[int],
            LANES: cutlass.Constexpr[int], COLUMNS: cutlass.Constexpr[int],
            FORMAT: cutlass.Constexpr[str], SWIZZLED: cutlass.Constexpr[bool]):
    threads = WARPS * WARP
    per_block = threads * VECTORS_PER_THREAD
    vectors = Int64(cute.size(mX, mode=[0])) * (cute.size(mX, mode=[1]) // VEC)
    data_blocks = Int32((vectors + per_block - 1) // per_block)
    padding_blocks = Int32(0)
    if cutlass.const_expr(SWIZZLED):
        padded_words = ((cute.size(mScales, mode=[0]) - cute.size(mX, mode=[0]))
                        * (cute.size(mScales, mode=[1]) // scale_layout.TILE_COLUMNS))
        # Never negative, whatever rows a call's scales have (the op checks them).
        padding_blocks = cutlass.max((padded_words + per_block - 1) // per_block, 0)
    _block_quant_kernel(mX, mGlobalScale, mQ, mScales, data_blocks, VEC, VECTORS_PER_THREAD,
                        threads, LANES, COLUMNS, FORMAT, SWIZZLED, has_e2m1_conversion()).launch(
        grid=(data_blocks + padding_blocks, 1, 1), block=(threads, 1, 1), stream=stream)


@cute.jit
def _nvfp4_launch(mX: cute.Tensor, mGlobalScale: cute.Tensor, mQ: cute.Tensor,
                  mScales: cute.Tensor, stream: cuda.CUstream, VEC: cutlass.Constexpr[int],
                  VECTORS_PER_THREAD: cutlass.Constexpr[int], WARPS: cutlass.Constexpr[int],
                  LANES: cutlass.Constexpr[int], COLUMNS: cutlass.Constexpr[int],
                  SWIZZLED: cutlass.Constexpr[bool]):
    _launch(mX, mGlobalScale, mQ, mScales, stream, VEC, VECTORS_PER_THREAD, WARPS, LANES,
            COLUMNS, NVFP4, SWIZZLED)


@cute.jit
def _mxfp8_launch(mX: cute.Tensor, mQ: cute.Tensor, mScales: cute.Tensor,
                  stream: cuda.CUstream, VEC: cutlass.Constexpr[int],
                  VECTORS_PER_THREAD: cutlass.Constexpr[int], WARPS: cutlass.Constexpr[int],
                  LANES: cutlass.Constexpr[int], COLUMNS: cutlass.Constexpr[int],
                  SWIZZLED: cutlass.Constexpr[bool]):
    # MXFP8 has no global scale: x stands in for it, and the MXFP8 body never reads it.
    _launch(mX, mX, mQ, mScales, stream, VEC, VECTORS_PER_THREAD, WARPS, LANES, COLUMNS, MXFP8,
            SWIZZLED)


def compile_kernel(problem: BlockQuantProblem, config: BlockQuantConfig, options: str = ""):
    """Compile for the target in --gpu-arch (options) or CUTE_DSL_ARCH from fake tensors: the
    token count, the row strides and the swizzled scales' padded rows are symbolic, so the
    result serves every call."""
    vec = vector_elements(problem, config)
    tokens = cute.sym_int()
    # A 256-bit load needs its address 32-byte aligned.
    x = fake_rows(CUTLASS_DTYPES[problem.dtype], tokens, (problem.hidden,), vec,
                  assumed_align=max(16, config.vector_bits // 8))
    q = fake_rows(VALUE_TYPES[problem.format], tokens,
                  (problem.hidden // PACKING[problem.format],), vec // PACKING[problem.format],
                  assumed_align=16)
    scale_rows = cute.sym_int() if problem.swizzled else tokens
    columns = scale_layout.scales_shape(problem.scale_layout, 1, problem.scale_columns)[1]
    scales = fake_compact(SCALE_TYPES[problem.format], (scale_rows, columns), assumed_align=16)
    constants = (vec, config.vectors_per_thread, config.warps_per_block,
                 lanes_per_block(problem, config), problem.scale_columns, problem.swizzled)
    if problem.format == NVFP4:
        global_scale = fake_compact(Float32, (1,), assumed_align=4)
        return compile_launcher(_nvfp4_launch, (x, global_scale, q, scales), constants, options)
    return compile_launcher(_mxfp8_launch, (x, q, scales), constants, options)

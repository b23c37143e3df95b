"""Where a block scale lives: the two layouts block_quant's kernels write their scales in.

row_major: (tokens, hidden / block), scale (row, block) at row * (hidden / block) + block.

swizzled: the layout Blackwell's block-scaled GEMMs (tcgen05.mma with block scaling, cuBLAS's
1D block scaling, CUTLASS's SfAtom, flashinfer's and vLLM's "swizzled" scales) read. The scale
matrix is padded to whole 128 x 4 tiles (rows to a multiple of 128, scale columns to a multiple
of 4); tiles are stored row of tiles by row of tiles, each tile as 512 contiguous bytes in which
row r (of 128) and column c (of 4) lie at (r % 32) * 16 + (r // 32) * 4 + c: the 32 x 4 x 4
interleave. In one formula, for a padded width of C scale columns:

    offset(row, col) = (row // 128) * 128 * C + (col // 4) * 512
                       + (row % 32) * 16 + (row % 128 // 32) * 4 + col % 4

as cuBLAS's documentation states it ("1D Block Scaling Factors Layout",
https://docs.nvidia.com/cuda/cublas/#d-block-scaling-factors-layout). The kernels hold the
swizzled scales as a (padded rows, C) tensor of those bytes, and write zeros into the padding
(as TensorRT-LLM's and flashinfer's quantisation kernels do), so every byte is defined.
"""

from __future__ import annotations

import torch

ROW_MAJOR = "row_major"
SWIZZLED = "swizzled"
SCALE_LAYOUTS = (SWIZZLED, ROW_MAJOR)
TILE_ROWS = 128
TILE_COLUMNS = 4
# Bytes of one 128 x 4 tile, and the interleave inside it.
TILE_BYTES = TILE_ROWS * TILE_COLUMNS
ROW_IN_32_STRIDE = 16
ROW_GROUP_STRIDE = 4


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def scales_shape(layout: str, rows: int, columns: int) -> tuple[int, int]:
    """The scale tensor's shape for `rows` tokens of `columns` blocks each."""
    if layout == SWIZZLED:
        return round_up(rows, TILE_ROWS), round_up(columns, TILE_COLUMNS)
    return rows, columns


def swizzled_offset(row, col, padded_columns: int):
    """The byte offset of scale (row, col) in the swizzled layout of `padded_columns` scale
    columns (a multiple of 4): the formula above, for ints or integer tensors alike."""
    return ((row // TILE_ROWS) * TILE_ROWS * padded_columns + (col // TILE_COLUMNS) * TILE_BYTES
            + (row % 32) * ROW_IN_32_STRIDE + (row % TILE_ROWS // 32) * ROW_GROUP_STRIDE
            + col % TILE_COLUMNS)


def swizzle(scales: torch.Tensor) -> torch.Tensor:
    """A (rows, columns) scale matrix in the swizzled layout, as a (padded rows, padded
    columns) tensor of its bytes, the padding zero. Built by tiling and permuting, as PyTorch's
    and torchao's `to_blocked` build it (the tests hold it to swizzled_offset)."""
    rows, columns = scales.shape
    padded_rows, padded_columns = scales_shape(SWIZZLED, rows, columns)
    padded = scales.new_zeros((padded_rows, padded_columns))
    padded[:rows, :columns] = scales
    tiles = padded.view(padded_rows // TILE_ROWS, TILE_ROWS, padded_columns // TILE_COLUMNS,
                        TILE_COLUMNS).permute(0, 2, 1, 3)
    # In a tile, row r = 32 * g + i goes to (i, g): 32 rows of 4 groups of 4 columns.
    interleaved = tiles.reshape(-1, 4, 32, TILE_COLUMNS).transpose(1, 2)
    return interleaved.reshape(padded_rows, padded_columns)

"""The swizzled scale layout of Blackwell's block-scaled GEMMs: the tiled permutation
block_quant's reference builds (`swizzle`) against the offset formula (`swizzled_offset`), and
both against entries worked from cuBLAS's documented formula.

cuBLAS, "1D Block Scaling Factors Layout" (https://docs.nvidia.com/cuda/cublas/#d-block-scaling-
factors-layout): for a scale matrix of C = round_up(K / block, 4) columns, scale (row, col) of
the 128 x 4 tile (row // 128, col // 4) lies at
    ((row // 128) * (C // 4) + col // 4) * 512 + (row % 32) * 16 + (row % 128 // 32) * 4 + col % 4
"""

import pytest
import torch

from cutetune.kernels.scale_layout import scales_shape, swizzle, swizzled_offset


def _cublas_offset(row: int, col: int, padded_columns: int) -> int:
    return (((row // 128) * (padded_columns // 4) + col // 4) * 512 + (row % 32) * 16
            + (row % 128 // 32) * 4 + col % 4)


# (row, col, padded columns) -> byte offset, worked by hand from cuBLAS's formula: consecutive
# columns of a row are adjacent bytes within a tile's 4; rows 32 apart share a 16-byte line;
# consecutive rows are 16 bytes apart; the next 4 columns start the next 512-byte tile; the next
# 128 rows start after a whole row of tiles.
KNOWN = [(0, 0, 8, 0), (0, 1, 8, 1), (0, 3, 8, 3), (1, 0, 8, 16), (31, 0, 8, 496),
         (32, 0, 8, 4), (64, 2, 8, 10), (127, 3, 8, 511), (0, 4, 8, 512), (5, 6, 8, 594),
         (128, 0, 8, 1024), (130, 5, 8, 1024 + 512 + 2 * 16 + 1), (300, 9, 12, 2 * 1536
                                                                   + 2 * 512 + 12 * 16 + 4 + 1)]


@pytest.mark.parametrize(("row", "col", "columns", "offset"), KNOWN)
def test_offsets_worked_from_cublas(row, col, columns, offset):
    assert swizzled_offset(row, col, columns) == offset == _cublas_offset(row, col, columns)


@pytest.mark.parametrize(("rows", "columns"), [(1, 1), (5, 3), (128, 4), (129, 8), (300, 10),
                                               (256, 448)])
def test_swizzle_puts_every_scale_at_its_offset_and_zeros_the_padding(rows, columns):
    scales = torch.randint(1, 256, (rows, columns), dtype=torch.uint8)
    swizzled = swizzle(scales)
    padded_rows, padded_columns = scales_shape("swizzled", rows, columns)
    assert swizzled.shape == (padded_rows, padded_columns) == (
        -(-rows // 128) * 128, -(-columns // 4) * 4)
    flat = swizzled.flatten()
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
    offsets = swizzled_offset(r, c, padded_columns)
    assert torch.equal(flat[offsets], scales)
    written = torch.zeros(flat.numel(), dtype=torch.bool)
    written[offsets.flatten()] = True
    assert offsets.unique().numel() == rows * columns  # no two scales share a byte
    assert int(flat[~written].count_nonzero()) == 0


def test_row_major_shape_is_unpadded():
    assert scales_shape("row_major", 5, 3) == (5, 3)

"""The element types kernels accept, by the names used in problems, the CLI and the DB."""

from __future__ import annotations

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# (rtol, atol) against an fp32 reference: a few ulps of the output type.
FLOAT_TOLERANCE = {"bfloat16": (1.6e-2, 1e-2), "float16": (2e-3, 1e-3), "float32": (1e-5, 1e-5)}


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported: use one of "
                        f"{', '.join(str(t) for t in TORCH_DTYPES.values())}") from None


# The vector widths kernels access global memory with, widest first.
VECTOR_BITS = (128, 64, 32)


def vector_elements(dtype: str, bits: int) -> int:
    """Elements of `dtype` in one `bits`-wide vector (0 when one element is wider)."""
    return bits // (8 * DTYPE_BYTES[dtype])


def widest_vector_bits(dtype: str, width: int) -> int:
    """The widest of VECTOR_BITS whose elements divide `width`; 0 when none does."""
    return next((bits for bits in VECTOR_BITS if width % vector_elements(dtype, bits) == 0), 0)

"""The CuTeDSL element types of the dtype names problems use."""

from __future__ import annotations

import cutlass

CUTLASS_DTYPES = {
    "bfloat16": cutlass.BFloat16,
    "float16": cutlass.Float16,
    "float32": cutlass.Float32,
}

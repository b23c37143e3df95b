"""The host side of a warm warmup, on any machine: `cutetune.warmup(MODEL)` in this fresh
process, every point loaded from the artifact cache `cutetune cache build --model MODEL` filled
(the settings' cache dir, CUTETUNE_CACHE_DIR), the GPU faked as an H200 (its fingerprint, and
torch told a GPU is there: loading an artifact needs none, nothing is launched). Prints the
time of the warmup call (torch already imported), the cache's summary and the CuTeDSL modules
the process imported (none, where the artifacts load without it).

    cutetune cache build --model qwen3-8b && python3 -m benchmarks.warm_warmup_host qwen3-8b
"""

from __future__ import annotations

import sys
import tempfile
import time
from importlib import metadata

import torch

import cutetune
from cutetune.results_db import DeviceFingerprint

H200 = DeviceFingerprint("NVIDIA H200", "9.0", 132, "13.0", "13.0", torch.__version__,
                         metadata.version("nvidia-cutlass-dsl"))


def main(model: str) -> None:
    torch.cuda.is_available = lambda: True
    DeviceFingerprint.current = classmethod(lambda cls, device_index=None: H200)
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        dispatcher = cutetune.warmup(model, db_url=f"sqlite:///{scratch}/empty.db")
        seconds = time.perf_counter() - start
    imported = sorted({name for name in sys.modules if name.startswith("cutlass")})
    print(f"{model}: warm warmup {seconds:.2f} s; {dispatcher.cache_summary()}; CuTeDSL "
          f"modules imported: {len(imported)}")


if __name__ == "__main__":
    main(sys.argv[1])

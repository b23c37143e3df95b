"""The PTX of every shipped winner's point and of each kernel's covering points (testkit's
all-pairs points of the first preset problem it has), compiled for sm_90a on this machine and
hashed, one line per point: run it before and after a change that must not change the generated
code (moving kernel code between modules, say), and compare the two files.

    python3 -m benchmarks.ptx_fingerprints OUT.json

A kernel's PTX names its functions by their Python names, not by their modules, so a move that
keeps the names keeps the text. Equal files let winners tuned before the change be carried over
to the code hash after it (cutetune/shipped_winners/ was, so).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


def points() -> list[tuple[str, str, str]]:
    """(kernel, static key, config JSON) of every point to fingerprint, sorted."""
    from cutetune.device.specs import device_spec_for
    from cutetune.kernels.registry import NotApplicableError, get_kernel, kernel_names
    from cutetune.results_db import shipped_with_devices
    from cutetune.spaces.models import PRESETS
    from cutetune.spaces.space import config_to_json
    from testkit.covering_points import covering_configs

    spec = device_spec_for("NVIDIA H200")
    found = {(w.kernel_name, w.static_key, w.config_json): None
             for _, w in shipped_with_devices()}
    models = [*PRESETS.values(), dataclasses.replace(PRESETS["qwen3-0.6b"], name="geglu",
                                                     hidden_act="gelu_pytorch_tanh")]
    for name in kernel_names():
        kernel = get_kernel(name)
        for model in models:
            try:
                problem = kernel.problems_for_model(model, "bfloat16")[0]
            except NotApplicableError:
                continue
            for config in covering_configs(kernel, problem, spec):
                found[(name, problem.static_key(), config_to_json(config))] = None
            break
    return sorted(found)


def fingerprint(point: tuple[str, str, str]) -> tuple[str, str]:
    """The point's key and the hash of its PTX files, with how many there are."""
    from cutetune.kernels.registry import get_kernel

    name, static_key, config_json = point
    kernel = get_kernel(name)
    problem = kernel.problem_type(num_tokens=1, **json.loads(static_key))
    config = kernel.space.config_from_dict(json.loads(config_json))
    with tempfile.TemporaryDirectory() as dump:
        kernel.compile_function(problem, config, f"--keep-ptx --dump-dir {dump}")
        texts = [path.read_bytes() for path in sorted(Path(dump).glob("*.ptx"))]
    digest = hashlib.sha256(b"\0".join(texts)).hexdigest()[:24]
    return "|".join(point), f"{digest} {len(texts)}"


if __name__ == "__main__":
    chosen = points()
    print(f"{len(chosen)} points", file=sys.stderr, flush=True)
    with multiprocessing.get_context("spawn").Pool(os.cpu_count()) as pool:
        result = dict(pool.map(fingerprint, chosen, chunksize=4))
    Path(sys.argv[1]).write_text(json.dumps(result, indent=0, sort_keys=True))

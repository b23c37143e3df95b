"""The kernels' declarations (problems, spaces, defaults, costs, code hashes), the dispatcher's
plan and the public ops import no CuTeDSL: its import costs seconds, and a warmup from the
artifact cache, planning and the CLI need none of it. Only a compile imports the device code
(cutetune/kernels/device/ and moe_dispatch's *_kernels and compile modules)."""

from __future__ import annotations

import subprocess
import sys

PLAN_EVERY_KERNEL = """
import sys
import cutetune
from cutetune.serving.table import Dispatcher
from cutetune.kernels.registry import NotApplicableError, get_kernel, kernel_names
import cutetune.ops  # every op
from cutetune.spaces.models import PRESETS
from cutetune.device.specs import device_spec_for

spec = device_spec_for("NVIDIA H200")
dispatcher = Dispatcher(spec)
planned = 0
for name in kernel_names():
    kernel = get_kernel(name)
    kernel.source_hash()
    for model in PRESETS.values():
        try:
            problems = kernel.problems_for_model(model, "bfloat16")
        except NotApplicableError:
            continue
        for problem in problems:
            entry = dispatcher.plan.entry_for(kernel, problem.with_tokens(64))
            kernel.cost(problem.with_tokens(64), entry.config, spec)
            planned += 1
print(planned, sorted({m.split(".")[0] for m in sys.modules if m.startswith("cutlass")}))
"""


def test_planning_every_kernel_and_importing_the_ops_import_no_cutedsl():
    done = subprocess.run([sys.executable, "-c", PLAN_EVERY_KERNEL], capture_output=True,
                          text=True, check=True)
    planned, imported = done.stdout.split(" ", 1)
    assert int(planned) > 20
    assert imported.strip() == "[]"


def test_a_compile_imports_the_device_code():
    done = subprocess.run([sys.executable, "-c", """
import sys
from cutetune.kernels import activation
from cutetune.device.specs import device_spec_for
problem = activation.SiluAndMulProblem(num_tokens=1, dtype="bfloat16", intermediate=1536)
config = activation.SILU_KERNEL.default_config(problem, device_spec_for("NVIDIA H200"))
before = "cutlass" in sys.modules
activation.SILU_KERNEL.compile(problem, config)
print(before, "cutetune.kernels.device.activation" in sys.modules)
"""], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True"]

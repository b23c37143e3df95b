"""The winners the package ships (cutetune/shipped_winners/MODEL-h200.json): each file holds
a winner for every tuned bucket (1..32768) of every problem its model's kernels have, measured
on the H200 by the code of this commit (its code-closure hash), so that a warmup on an H200
serves every bucket of those models from it. A kernel change that moves a hash fails here:
re-tune the model on the H200 (`cutetune tune --model M`) and write the file again
(`cutetune export --format json --all-devices --current --model M --out
cutetune/shipped_winners/M-h200.json`)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.registry import NotApplicableError, get_kernel, kernel_names
from cutetune.results_db import DeviceFingerprint, shipped_winners
from cutetune.results_db.export import read_winners
from cutetune.serving.plan import NEAREST, SHIPPED
from cutetune.serving.table import Dispatcher
from cutetune.spaces.buckets import BUCKETS, DEFAULT_TUNE_TOKENS
from cutetune.spaces.models import load_model
from testkit.h200_results import AWAITING_H200_TUNE

SHIPPED_FILES = sorted(Path(str(resources.files("cutetune") / "shipped_winners")).glob("*.json"))
H200 = DeviceFingerprint("NVIDIA H200", "9.0", 132, "13.0", "13.0", "2.11.0+cu130", "4.8.1")


def test_the_readme_names_every_shipped_model():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert SHIPPED_FILES
    for path in SHIPPED_FILES:
        assert f"`{path.name.removesuffix('-h200.json')}`" in readme.split("Shipped winners")[1]


@pytest.mark.parametrize("path", SHIPPED_FILES, ids=lambda p: p.name)
def test_a_shipped_file_serves_every_bucket_of_its_model_on_the_h200(path):
    model = load_model(path.name.removesuffix("-h200.json"))
    measured = read_winners(path.read_text(), "json")
    assert {device.gpu_name for device, _ in measured} == {"NVIDIA H200"}
    stale = sorted({w.kernel_name for _, w in measured
                    if w.source_hash != get_kernel(w.kernel_name).source_hash()})
    assert not stale, f"{path.name}: winners of older {', '.join(stale)} code; re-tune (above)"
    dispatcher = Dispatcher(DEVICE_SPECS["H200"], (), shipped=shipped_winners(H200))
    for name in kernel_names():
        if name in AWAITING_H200_TUNE:
            assert name not in {w.kernel_name for _, w in measured}, (
                f"{path.name} ships {name}'s winners: drop it from AWAITING_H200_TUNE")
            continue
        kernel = get_kernel(name)
        try:
            problems = kernel.problems_for_model(model, "bfloat16")
        except NotApplicableError:
            continue
        for problem in problems:
            sources = {b: dispatcher.plan.entry_for(kernel, problem.with_tokens(b)).source
                       for b in BUCKETS}
            # Tuned up to the largest bucket tuning covers; served from it beyond.
            assert sources == {b: SHIPPED if b in DEFAULT_TUNE_TOKENS else NEAREST
                               for b in BUCKETS}, (name, problem.describe(), sources)

"""The package's layers import one way: a test walks every import (those inside functions too)
and fails on one that reaches a layer the importing layer may not use."""

from __future__ import annotations

import ast
from pathlib import Path

import cutetune

PACKAGE = Path(cutetune.__file__).parent
# Each layer and the layers it may import. Kernels declare kernels and know nothing of how
# they are tuned, stored or served; the public ops sit above the dispatcher they call, and the
# integrations above the ops.
MAY_IMPORT = {
    "settings": set(),
    "version": set(),
    # Files written whole, for the code-hash memo (kernels).
    "atomic_file": set(),
    "spaces": set(),
    # An import checks each winner's point against today's kernels (kernels.stored); a stored
    # calibration reads back as the device model's CalibratedModel.
    "results_db": {"spaces", "kernels", "device"},
    "kernels": {"spaces", "atomic_file"},
    # The device model: specs and ceilings, the roofline and its funnel, timing, verification.
    "device": {"spaces", "kernels"},
    # Points built into files and processes: the artifact store, the compile pool, supervised
    # worker processes, and the one way a built file is published.
    "build": {"spaces", "kernels", "atomic_file"},
    # The search and the run; nothing below it and nothing of the runtime imports it.
    "tuner": {"spaces", "kernels", "results_db", "atomic_file", "device", "build"},
    # What fixes a kernel's problem in an op's call, declared beside each op; the ops' fast
    # path (C++ routes) keyed by it, which an op's checked path tells what the dispatcher serves.
    "fast_call": set(),
    "fast_path": {"spaces", "kernels", "fast_call", "settings", "build"},
    # The runtime: the plan (which point serves each bucket, compiling nothing), the serving
    # table (rows of compiled points, lookup, counters) and the warmup. It never imports the
    # search (tuner), nor does anything above it but the CLI.
    # The calibrated model's picks are remembered in a file written whole (atomic_file).
    "serving": {"spaces", "kernels", "device", "build", "results_db", "settings", "fast_path",
                "atomic_file"},
    "ops": {"spaces", "kernels", "serving", "fast_call", "fast_path"},
    "bench": {"spaces", "kernels", "device", "build", "results_db", "serving"},
    # The tuning report reads the database and asks the serving plan and the device model's
    # funnel what they would do with it; it compiles nothing, and only the CLI runs it.
    "report": {"spaces", "kernels", "device", "results_db", "serving", "bench", "settings"},
    # The CLI's plan and tune commands are the search's front end: the one layer above tuner.
    "cli": {"spaces", "kernels", "device", "build", "tuner", "results_db", "serving", "ops",
            "bench", "settings", "version", "report"},
    # Other libraries' models served by the public ops; nothing in cutetune imports them.
    "integrations": {"spaces", "kernels", "serving", "ops"},
    "__init__": {"serving", "ops", "version"},
}


def layer_of(module: str) -> str:
    """cutetune.kernels.rmsnorm -> kernels; cutetune.bench -> bench; cutetune -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_cutetune_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("cutetune"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cutetune"):
            names.add(node.module)
    return names


def test_every_module_belongs_to_a_layer():
    layers = {layer_of(".".join(("cutetune", *p.relative_to(PACKAGE).with_suffix("").parts)))
              for p in PACKAGE.rglob("*.py")}
    assert layers <= set(MAY_IMPORT), layers - set(MAY_IMPORT)


def test_no_import_points_up():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(("cutetune", *path.relative_to(PACKAGE).with_suffix("").parts))
        if path.name == "__init__.py":
            module = module.removesuffix(".__init__")
        layer = layer_of(module)
        for imported in imported_cutetune_modules(path):
            target = layer_of(imported)
            if target != layer and target not in MAY_IMPORT[layer]:
                upward.append(f"{path.relative_to(PACKAGE.parent)} imports {imported}")
    assert upward == []


def test_the_runtime_imports_nothing_of_the_search():
    runtime = ("serving", "ops", "bench", "report", "integrations", "__init__")
    assert [layer for layer in runtime if "tuner" in MAY_IMPORT[layer]] == []

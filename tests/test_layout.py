"""The tests and the benchmarks are clients of public seams (issue 37, item 5): `tests/` holds
tests only, in folders that mirror the package's (or the repository's: benchmarks/, testkit/,
docs/); what they share, among themselves and with the benchmarks, is the `testkit` package;
and nothing reaches another folder of the tree by editing sys.path."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# Folders of tests/ that mirror no folder: the suite run on the GPU machine, and test inputs.
NOT_MIRRORS = {"gpu": "the GPU suite (pytest -m gpu tests/gpu)", "data": "test inputs"}
# Top-level test modules that test the package as a whole rather than one top-level module.
WHOLE_PACKAGE = {"test_layers.py", "test_layout.py"}
# A sys.path edit that reaches no folder of the tree.
PATH_EDITS_ALLOWED = {
    "tests/kernels/test_code_hash.py": "imports a copy of cutetune/kernels made under tmp_path",
}


def test_tests_holds_only_tests():
    helpers = [str(p.relative_to(ROOT)) for p in TESTS.rglob("*.py")
               if not (p.name.startswith("test_") or p.name == "conftest.py")]
    assert helpers == [], "helpers belong in testkit/"


def test_no_test_module_imports_another():
    """What two test modules share is a helper of testkit (pytest's rootdir imports would find
    a test module by its name, but only while the two sit where they do)."""
    imports = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            imports += [f"{path.relative_to(ROOT)} imports {name}" for name in names
                        if name.split(".")[0].startswith("test_") or name == "conftest"]
    assert imports == []


def test_the_test_folders_mirror_the_package():
    for folder in (p for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if folder.name in NOT_MIRRORS or folder.name == "__pycache__":
            continue
        assert (ROOT / "cutetune" / folder.name).is_dir() or (ROOT / folder.name).is_dir(), (
            f"tests/{folder.name} mirrors no folder of cutetune/ or of the repository")
    for module in TESTS.glob("test_*.py"):
        if module.name in WHOLE_PACKAGE:
            continue
        tested = module.name.removeprefix("test_")
        assert (ROOT / "cutetune" / tested).is_file(), (
            f"tests/{module.name} tests no top-level module of cutetune: move it to the folder "
            "of what it tests")


def _edits_sys_path(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    if node.func.attr == "syspath_prepend":
        return True
    owner = node.func.value
    return (node.func.attr in ("insert", "append", "extend")
            and isinstance(owner, ast.Attribute) and owner.attr == "path"
            and isinstance(owner.value, ast.Name) and owner.value.id == "sys")


def test_nothing_imports_through_an_edited_sys_path():
    edits = []
    for top in ("tests", "benchmarks", "testkit"):
        for path in sorted((ROOT / top).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if name in PATH_EDITS_ALLOWED:
                continue
            tree = ast.parse(path.read_text())
            edits += [f"{name}:{node.lineno}" for node in ast.walk(tree) if _edits_sys_path(node)]
    assert edits == [], "import from testkit or benchmarks as packages instead"

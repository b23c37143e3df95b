"""The code-closure hash: comments and docstrings do not count, a helper's code does."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from cutetune.kernels import activation, code_hash, moe_combine, qk_norm, rmsnorm
from cutetune.kernels.code_hash import KERNELS_DIR, code_closure, code_closure_hash
from cutetune.kernels.registry import KernelDef

KERNEL = '''"""A kernel."""

import helper  # the device code
from cutetune.kernels import cache_hints


def body(x):
    """Doubles x."""
    return helper.twice(x)
'''
HELPER = '''def twice(x):
    return 2 * x
'''


def write_package(root: Path, kernel: str = KERNEL, helper: str = HELPER) -> Path:
    (root / "helper.py").write_text(helper)
    path = root / "kernel.py"
    path.write_text(kernel)
    return path


def test_the_closure_holds_the_kernel_and_the_helpers_it_generates_code_from(tmp_path,
                                                                            monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write_package(tmp_path)
    assert code_closure(path) == sorted([path.resolve(), (tmp_path / "helper.py").resolve(),
                                         KERNELS_DIR / "cache_hints.py"])
    names = {p.name for p in code_closure(Path(rmsnorm.__file__))}
    assert {"rmsnorm.py", "cache_hints.py", "dtypes.py"} <= names
    assert not {"registry.py", "code_hash.py"} & names


def test_the_closure_is_found_without_importing_what_the_kernel_imports(tmp_path, monkeypatch):
    """A peer imported inside a function (liger_kernel.ops...) is not imported to find the
    closure: importing it costs a warmup seconds (transformers, torch._dynamo)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "heavy_peer").mkdir()
    (tmp_path / "heavy_peer" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (tmp_path / "heavy_peer" / "ops.py").write_text("def forward(x):\n    return x\n")
    path = write_package(tmp_path, kernel=KERNEL + "\n\ndef peer():\n"
                                                   "    from heavy_peer.ops import forward\n")
    assert code_closure(path) == sorted([path.resolve(), (tmp_path / "helper.py").resolve(),
                                         KERNELS_DIR / "cache_hints.py"])
    assert "heavy_peer" not in sys.modules


def test_comments_and_docstrings_keep_the_hash(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    before = code_closure_hash(write_package(tmp_path))
    edited = KERNEL.replace('"""Doubles x."""', '"""Returns two times x."""').replace(
        "# the device code", "# where the device code lives")
    assert code_closure_hash(write_package(tmp_path, kernel=edited)) == before


def test_a_change_in_a_helper_changes_the_hash(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    before = code_closure_hash(write_package(tmp_path))
    assert code_closure_hash(write_package(tmp_path, helper=HELPER.replace("2 *", "3 *"))) \
        != before
    assert code_closure_hash(write_package(tmp_path)) == before


# The shared modules each kernel's code comes from: editing one must drop the stored winners of
# every kernel built on it.
SHARED_MODULES = {
    rmsnorm: {"device/rmsnorm.py", "device/blocks.py", "device/compiling.py", "block_limits.py",
              "cache_hints.py", "device/cache_hints.py"},
    qk_norm: {"device/qk_norm.py", "device/blocks.py", "device/compiling.py", "block_limits.py"},
    activation: {"device/activation.py", "device/compiling.py", "block_limits.py",
                 "cache_hints.py", "device/cache_hints.py"},
    moe_combine: {"device/moe_combine.py", "device/compiling.py", "block_limits.py",
                  "moe_common.py"},
}


@pytest.mark.parametrize("kernel_module", SHARED_MODULES, ids=lambda m: m.__name__)
def test_the_closure_holds_the_shared_building_blocks(kernel_module):
    """The closure of the kernel's declaration and of the device module its DeviceCompile
    names, as its source hash covers them."""
    kernel = next(value for value in vars(kernel_module).values()
                  if isinstance(value, KernelDef))
    closure = code_closure(Path(kernel.source_file), kernel.compile_function.source_file)
    names = {p.relative_to(KERNELS_DIR).as_posix() for p in closure
             if p.is_relative_to(KERNELS_DIR)}
    assert SHARED_MODULES[kernel_module] <= names
    assert kernel.source_hash() == code_closure_hash(Path(kernel.source_file),
                                                     kernel.compile_function.source_file)


def test_the_hashed_text_is_the_same_under_every_python_version():
    """Pinned text: ast.dump differs between 3.11, 3.12 (empty type_params) and 3.13 (empty
    fields left out), and a winner tuned under one interpreter must be served under another.
    Fields that hold nothing are left out; a None constant keeps its node."""
    tree = ast.parse('def f(x: int = 1) -> None:\n    """doc"""\n    return x if x else None\n')
    assert code_hash._code_of(tree) == (
        "Module(body=[FunctionDef(name='f', args=arguments(args=[arg(arg='x', "
        "annotation=Name(id='int', ctx=Load()))], defaults=[Constant(value=1)]), "
        "body=[Return(value=IfExp(test=Name(id='x', ctx=Load()), body=Name(id='x', "
        "ctx=Load()), orelse=Constant()))], returns=Constant())])")


def _memo_in(path: Path, monkeypatch) -> None:
    """remember_in(path) as a fresh process does it (nothing parsed yet), with the process's
    memo put back after the test."""
    monkeypatch.setattr(code_hash, "_memo", code_hash._memo)
    code_hash._analysed.cache_clear()
    code_hash.remember_in(path)


def test_a_remembered_closure_is_hashed_again_without_parsing(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write_package(tmp_path)
    memo = tmp_path / "cache" / code_hash.CODE_HASHES
    _memo_in(memo, monkeypatch)
    first = code_closure_hash(path)
    closure = code_closure(path)
    assert memo.is_file()

    _memo_in(memo, monkeypatch)  # as a later process does
    monkeypatch.setattr(ast, "parse", lambda *a, **k: pytest.fail("parsed a remembered file"))
    assert code_closure_hash(path) == first
    assert code_closure(path) == closure


def test_a_remembered_hash_is_never_served_for_changed_code(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    memo = tmp_path / code_hash.CODE_HASHES
    _memo_in(memo, monkeypatch)
    before = code_closure_hash(write_package(tmp_path))
    _memo_in(memo, monkeypatch)
    changed = code_closure_hash(write_package(tmp_path, helper=HELPER.replace("2 *", "3 *")))
    code_hash.remember_in(tmp_path / "elsewhere.json")  # nothing remembered: worked out anew
    assert changed == code_closure_hash(write_package(tmp_path, helper=HELPER.replace("2 *",
                                                                                      "3 *")))
    assert changed != before


def test_a_memo_of_another_hashing_or_no_memo_at_all_is_worked_out_anew(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write_package(tmp_path)
    expected = code_closure_hash(path)
    memo = tmp_path / code_hash.CODE_HASHES
    _memo_in(memo, monkeypatch)
    code_closure_hash(path)
    stored = memo.read_text()
    memo.write_text(stored.replace(code_hash._MEMO_VERSION, "an older hashing").replace(
        expected, "0" * 16))
    _memo_in(memo, monkeypatch)
    assert code_closure_hash(path) == expected
    memo.write_text("{half a file")
    _memo_in(memo, monkeypatch)
    assert code_closure_hash(path) == expected
    unwritable = tmp_path / "file" / code_hash.CODE_HASHES
    (tmp_path / "file").write_text("a file where the memo's folder would be")
    _memo_in(unwritable, monkeypatch)
    assert code_closure_hash(path) == expected

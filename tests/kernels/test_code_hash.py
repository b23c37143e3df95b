"""The code-closure hash: comments and docstrings do not count, a helper's code does."""

from __future__ import annotations

import ast
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cutetune.kernels import activation, code_hash, moe_combine, qk_norm, rmsnorm
from cutetune.kernels.code_hash import KERNELS_DIR, code_closure, code_closure_hash
from cutetune.kernels.registry import KernelDef, get_kernel, kernel_names
from cutetune.spaces.space import Alternatives

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


# A declaration beside what the device code uses of it: a config, the helper a compile reads, and
# a heuristic, a constraint and a cost model that only the search reads.
DECLARATION = '''"""A kernel's declaration."""

from dataclasses import dataclass

import constants
from constants import WIDE, NARROW


@dataclass(frozen=True)
class Config:
    width: int
    hints: str = constants.PLAIN


def elements(config):
    return config.width // BITS


BITS = 8
FIT = lambda config: elements(config) <= WIDE  # noqa: E731


def default_config():
    return Config(WIDE)


def cost(config):
    return NARROW * config.width
'''
CONSTANTS = '''PLAIN, STREAMING = "plain", "streaming"
WIDE, NARROW = 128, 32
'''
DEVICE = '''import cutlass

from declaration import elements


def compile_kernel(config):
    return cutlass.compile(elements(config))
'''


def write_kernel(root: Path, **edits: tuple[str, str]) -> tuple[Path, Path]:
    """DECLARATION, CONSTANTS and DEVICE as files declaration.py, constants.py and
    device.py of `root`, each edited by the (old, new) given under its name; the device file
    and the declaration's file."""
    for name, text in (("declaration", DECLARATION), ("constants", CONSTANTS),
                       ("device", DEVICE)):
        old, new = edits.get(name, ("", ""))
        assert old in text
        (root / f"{name}.py").write_text(text.replace(old, new))
    return root / "device.py", root / "declaration.py"


def kernel_hash(root: Path, **edits: tuple[str, str]) -> str:
    device, declaration = write_kernel(root, **edits)
    return code_closure_hash(device, definitions=[(declaration, "Config")])


@pytest.mark.parametrize("edits", [
    {"declaration": ("return Config(WIDE)", "return Config(NARROW)")},
    {"declaration": ("NARROW * config.width", "2 * config.width")},
    {"declaration": ("<= WIDE", "< WIDE")},
    {"constants": ("WIDE, NARROW = 128, 32", "WIDE, NARROW = 128, 64")},
    {"constants": ("32\n", "32\nFAST = 4\n")},
    {"declaration": ("from constants import WIDE, NARROW",
                     "from constants import WIDE, NARROW, STREAMING")},
    {"declaration": ("def cost(config):", "def cost(config):\n    \"\"\"Bytes.\"\"\"")},
], ids=["heuristic", "cost", "constraint", "a constant only those use", "a new constant",
        "a name more imported", "a docstring"])
def test_what_the_device_code_and_the_config_do_not_use_keeps_the_hash(tmp_path, monkeypatch,
                                                                       edits):
    monkeypatch.syspath_prepend(str(tmp_path))
    assert kernel_hash(tmp_path, **edits) == kernel_hash(tmp_path)


@pytest.mark.parametrize("edits", [
    {"device": ("elements(config)", "2 * elements(config)")},
    {"declaration": ("// BITS", "// BITS + 1")},
    {"declaration": ("BITS = 8", "BITS = 16")},
    {"declaration": ("    width: int\n", "    width: int\n    depth: int = 1\n")},
    {"constants": ('PLAIN, STREAMING = "plain"', 'PLAIN, STREAMING = "normal"')},
    {"declaration": ("@dataclass(frozen=True)", "@dataclass")},
], ids=["device code", "a helper the device code imports", "a name that helper reads",
        "a config field", "a config field's default in another module", "the config's decorator"])
def test_what_the_device_code_or_the_config_uses_changes_the_hash(tmp_path, monkeypatch, edits):
    monkeypatch.syspath_prepend(str(tmp_path))
    assert kernel_hash(tmp_path, **edits) != kernel_hash(tmp_path)


def test_a_module_of_device_code_counts_whole(tmp_path, monkeypatch):
    """A module that imports CuTeDSL is device code: it counts whole, even where one of its
    names is imported. Of another module only what is used counts: constants.py for the
    config's default (constants.PLAIN: a module read by attribute is followed by the
    attribute)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    helpers = "import cutlass\n\n\ndef one():\n    return 1\n\n\ndef two():\n    return 2\n"
    (tmp_path / "helpers.py").write_text(helpers)
    imports_one = {"device": ("import cutlass\n", "import cutlass\nfrom helpers import one\n")}
    before = kernel_hash(tmp_path, **imports_one)
    (tmp_path / "helpers.py").write_text(helpers.replace("return 2", "return 3"))
    assert kernel_hash(tmp_path, **imports_one) != before
    device, declaration = write_kernel(tmp_path, **imports_one)
    taken = {t.module: t.units for t in code_hash._closure((device,), ((declaration, "Config"),))}
    assert set(taken) == {"device", "helpers", "declaration", "constants"}
    assert taken["device"] is None and taken["helpers"] is None
    assert None not in (taken["declaration"], taken["constants"])


def test_a_definition_the_file_lacks_is_an_error(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _, declaration = write_kernel(tmp_path)
    with pytest.raises(LookupError, match="no top-level definition of 'Konfig'"):
        code_closure_hash(definitions=[(declaration, "Konfig")])


def test_a_definition_nested_in_a_function_takes_its_file_whole(tmp_path, monkeypatch):
    """As a test's kernel declares its Config inside a function."""
    monkeypatch.syspath_prepend(str(tmp_path))
    _, declaration = write_kernel(tmp_path)
    assert code_closure_hash(definitions=[(declaration, "make.<locals>.Config")]) == \
        code_closure_hash(declaration)


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
    """The closure of the device module the kernel's DeviceCompile names and of its Problem
    and Config types, as its source hash covers them."""
    kernel = next(value for value in vars(kernel_module).values()
                  if isinstance(value, KernelDef))
    closure = code_closure(*kernel.device_files, definitions=kernel.schema_definitions)
    names = {p.relative_to(KERNELS_DIR).as_posix() for p in closure
             if p.is_relative_to(KERNELS_DIR)}
    assert SHARED_MODULES[kernel_module] <= names
    assert kernel.device_files == (kernel.compile_function.source_file,)
    assert kernel.source_hash() == code_closure_hash(*kernel.device_files,
                                                     definitions=kernel.schema_definitions)


# Every registered kernel, edited in a copy of cutetune/kernels that stands in for the package:
# what only the search reads keeps the stored winners, what the binary is built from drops them.


def kernels_copy(root: Path, monkeypatch) -> Path:
    """cutetune/kernels copied to root/cutetune/kernels, which the hashing then follows
    imports into instead of the package's own folder."""
    copy = root / "cutetune" / "kernels"
    shutil.copytree(KERNELS_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "cutetune" / "__init__.py").write_text("")
    monkeypatch.setattr(code_hash, "KERNELS_DIR", copy)
    monkeypatch.setattr(code_hash, "NOT_CODE", {copy / "registry.py", copy / "code_hash.py"})
    return copy


def in_copy(copy: Path, path: str | Path) -> Path:
    return copy / Path(path).resolve().relative_to(KERNELS_DIR)


def copied_hash(kernel: KernelDef, copy: Path) -> str:
    """The kernel's source hash, of the copy's files."""
    return code_closure_hash(*(in_copy(copy, path) for path in kernel.device_files),
                             definitions=[(in_copy(copy, path), name)
                                          for path, name in kernel.schema_definitions])


def edit(path: Path, picks: Callable[[ast.AST], bool], added: str = "; _edited = None") -> None:
    """Change the code of each function, lambda and class of the file `path` that `picks`
    picks, in place (no line moves): `0 or ` before a lambda's body, `added` after the last
    statement of a function's or a class's body."""
    text = path.read_text()
    places = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Lambda) and picks(node):
            places.append((node.body.lineno, node.body.col_offset, "0 or "))
        elif isinstance(node, ast.FunctionDef | ast.ClassDef) and picks(node):
            last = node.body[-1]
            places.append((last.end_lineno, last.end_col_offset, added))
    assert places, f"nothing to edit in {path}"
    lines = text.splitlines(keepends=True)
    for line, column, inserted in sorted(places, reverse=True):
        raw = lines[line - 1].encode()  # columns count UTF-8 bytes
        lines[line - 1] = (raw[:column] + inserted.encode() + raw[column:]).decode()
    path.write_text("".join(lines))
    assert ast.dump(ast.parse(path.read_text())) != ast.dump(ast.parse(text))


def edit_functions(copy: Path, *functions: Callable) -> None:
    """Change the code of each function or lambda (by its code object) in the copy."""
    for function in functions:
        code = function.__code__

        def picks(node: ast.AST, code=code) -> bool:
            if isinstance(node, ast.Lambda):
                return code.co_name == "<lambda>" and node.lineno == code.co_firstlineno
            return (getattr(node, "name", None) == code.co_name and min(
                n.lineno for n in (node, *node.decorator_list)) == code.co_firstlineno)

        edit(in_copy(copy, code.co_filename), picks)


def edit_docstrings_and_comments(path: Path) -> None:
    """Every docstring of the file worded anew (in place), and every comment."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            end = body[0].end_lineno - 1
            raw = lines[end].encode()
            column = body[0].end_col_offset - 3  # before the closing quotes
            assert raw[column:column + 3] in (b'"""', b"'''")
            lines[end] = (raw[:column] + b" Worded anew." + raw[column:]).decode()
    edited = "".join(lines).replace("# ", "# Worded anew: ")
    assert edited != text
    path.write_text(edited)


def constraints_of(kernel: KernelDef) -> list:
    space = kernel.space
    forms = space.forms if isinstance(space, Alternatives) else ()
    return [*space.constraints, *(c for form in forms for c in form.constraints)]


def device_imports(kernel: KernelDef, copy: Path) -> list[tuple[Path, str]]:
    """The functions and classes of the kernel's other modules its device module imports by
    name, each as (its file in the copy, its name)."""
    device = in_copy(copy, kernel.device_files[0])
    found = []
    for node in ast.parse(device.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module.startswith("cutetune.kernels."):
            source = copy.joinpath(*node.module.split(".")[2:]).with_suffix(".py")
            if not source.is_file() or code_hash._analysed(source.read_text())[2].device:
                continue
            defined = {d.name for d in ast.parse(source.read_text()).body
                       if isinstance(d, ast.FunctionDef | ast.ClassDef)}
            found += [(source, alias.name) for alias in node.names if alias.name in defined]
    return found


# The package's kernels, whose files these tests copy: a test module collected before this one
# may have registered a kernel of its own (testkit's fault kernel), whose files lie elsewhere.
KERNELS = [name for name in kernel_names()
           if all(Path(path).resolve().is_relative_to(KERNELS_DIR)
                  for path in get_kernel(name).device_files)]
SEARCH_ONLY = {
    "heuristic": lambda kernel, copy: edit_functions(copy, kernel.default_config),
    "cost model": lambda kernel, copy: edit_functions(copy, kernel.cost),
    "constraints": lambda kernel, copy: edit_functions(
        copy, *(c.holds for c in constraints_of(kernel))),
    "peers": lambda kernel, copy: edit_functions(copy, *(peer.build for peer in kernel.peers)),
    "docstrings and comments": lambda kernel, copy: [
        edit_docstrings_and_comments(in_copy(copy, path))
        for path in {kernel.source_file, *kernel.device_files,
                     *(path for path, _ in kernel.schema_definitions)}],
}


@pytest.mark.parametrize(("name", "edited"), [
    (name, edited) for name in KERNELS for edited in SEARCH_ONLY
    if edited != "peers" or get_kernel(name).peers])
def test_editing_what_only_the_search_reads_keeps_a_kernels_hash(tmp_path, monkeypatch, name,
                                                                 edited):
    kernel = get_kernel(name)
    expected = kernel.source_hash()  # of the package's files, before the copy stands in
    copy = kernels_copy(tmp_path, monkeypatch)
    assert copied_hash(kernel, copy) == expected
    SEARCH_ONLY[edited](kernel, copy)
    assert copied_hash(kernel, copy) == expected


@pytest.mark.parametrize("name", KERNELS)
def test_editing_a_kernels_device_code_changes_its_hash(tmp_path, monkeypatch, name):
    kernel = get_kernel(name)
    expected = kernel.source_hash()  # of the package's files, before the copy stands in
    copy = kernels_copy(tmp_path, monkeypatch)
    edit(in_copy(copy, kernel.device_files[0]),
         lambda node: getattr(node, "name", None) == "compile_kernel")
    assert copied_hash(kernel, copy) != expected


@pytest.mark.parametrize("name", KERNELS)
def test_editing_what_the_device_code_imports_changes_a_kernels_hash(tmp_path, monkeypatch,
                                                                     name):
    """Each function and class the device module imports from the kernel's other modules
    (e.g. rmsnorm's _vector_elements and RMSNormConfig), one at a time."""
    kernel = get_kernel(name)
    expected = kernel.source_hash()  # of the package's files, before the copy stands in
    copy = kernels_copy(tmp_path, monkeypatch)
    imported = device_imports(kernel, copy)
    assert imported
    for path, definition in imported:
        text = path.read_text()
        edit(path, lambda node, d=definition: getattr(node, "name", None) == d)
        assert copied_hash(kernel, copy) != expected, definition
        path.write_text(text)


@pytest.mark.parametrize("name", KERNELS)
def test_a_field_more_in_a_kernels_config_or_problem_changes_its_hash(tmp_path, monkeypatch,
                                                                       name):
    """The Config types fix how a stored config reads back; the Problem type what a compile
    reads. Each of them, one at a time."""
    kernel = get_kernel(name)
    expected = kernel.source_hash()  # of the package's files, before the copy stands in
    copy = kernels_copy(tmp_path, monkeypatch)
    for path, kind in kernel.schema_definitions:
        path = in_copy(copy, path)
        text = path.read_text()
        edit(path, lambda node, k=kind: isinstance(node, ast.ClassDef) and node.name == k,
             "; edited: int = 0")
        assert copied_hash(kernel, copy) != expected, kind
        path.write_text(text)


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
    # An import of several names is hashed name by name.
    assert code_hash._analysed("from a import b, c as d\n")[1] == (
        "ImportFrom(module='a', names=[alias(name='b')], level=0)",
        "ImportFrom(module='a', names=[alias(name='c', asname='d')], level=0)")


def _memo_in(path: Path, monkeypatch) -> None:
    """remember_in(path) as a fresh process does it (nothing parsed yet), with the process's
    memo put back after the test."""
    monkeypatch.setattr(code_hash, "_memo", code_hash._memo)
    code_hash._analysed.cache_clear()
    code_hash.remember_in(path)


def test_a_remembered_closure_is_hashed_again_without_parsing(tmp_path, monkeypatch):
    """Whole modules, and definitions followed as far as they reach."""
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write_package(tmp_path)
    device, declaration = write_kernel(tmp_path)
    definitions = [(declaration, "Config")]
    memo = tmp_path / "cache" / code_hash.CODE_HASHES
    _memo_in(memo, monkeypatch)
    first = code_closure_hash(path)
    closure = code_closure(path)
    followed = code_closure_hash(device, definitions=definitions)
    assert memo.is_file()

    _memo_in(memo, monkeypatch)  # as a later process does
    monkeypatch.setattr(ast, "parse", lambda *a, **k: pytest.fail("parsed a remembered file"))
    assert code_closure_hash(path) == first
    assert code_closure(path) == closure
    assert code_closure_hash(device, definitions=definitions) == followed


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

"""The hash that ties a stored winner to the code its binary is built from.

A kernel's binary is built by its device code from a Problem and a Config, and a stored
winner's config reads back through its Config type; the hash covers those and what they use,
at the granularity they use it. A module of device code (one that imports CuTeDSL) counts whole,
with what it imports. Of any other module only the top-level definitions asked for count and,
transitively, the top-level names their code references there and what the module imports for
them: `from X import a` follows a into X, `m.a` of an imported module m follows a, and a
module object used otherwise counts whole. So the heuristic, the cost model, the constraints
and the peers a declaration module holds beside the Config do not count: editing them keeps
the winners, while changing a definition the device code uses drops those of every kernel
built on it. Modules are followed into the folders of the roots, cutetune/kernels/ and
cutetune/kernels/device/, but not into the registry and this module, which declare and hash
kernels and generate no code. Each definition is hashed from its syntax tree with comments and
docstrings left out.

Parsing a closure's files is most of a warm warmup's time after the loads, so a process may keep
what it worked out in a file (`remember_in`): each file's definitions and what they use by the
hash of its text, and each closure's hash by what it takes of its files' texts. A later process
reads the texts, hashes them and looks the rest up; the keys include this module's own text and
the Python version, so a change of the hashing or of the parser is never served an old answer.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from cutetune.atomic_file import write_atomically

KERNELS_DIR = Path(__file__).resolve().parent
# The memo's file name in the artifact cache (cleared with it).
CODE_HASHES = "code-hashes.json"
NOT_CODE = {KERNELS_DIR / "registry.py", Path(__file__).resolve()}
# A module that imports this package is device code.
CUTEDSL = "cutlass"


class _Unit(NamedTuple):
    """One top-level definition of a file: the names it binds, the names its code reads (each
    with the attribute read of it, or None), the modules and names it imports within its code,
    and for an import of one name, the dotted name it binds. A NamedTuple, so that the memo
    stores it as a JSON row and reads it back as one."""

    names: tuple[str, ...]
    uses: tuple[tuple[str, str | None], ...]
    imports: tuple[str, ...]
    alias: str | None


class _Structure(NamedTuple):
    """What the closure walk needs of a file, without its code: whether it is device code, and
    its top-level definitions in source order."""

    device: bool
    units: tuple[_Unit, ...]


class _Taken(NamedTuple):
    """A file of a closure: its dotted module name, text and text hash, and the indices of the
    definitions the closure takes of it (None: the whole file)."""

    module: str
    path: Path
    text: str
    text_hash: str
    units: tuple[int, ...] | None


def code_closure(*paths: Path, definitions: Iterable[tuple[Path, str]] = ()) -> list[Path]:
    """The files the code of the modules `paths` (whole) and of the `definitions` (file,
    qualified name; one not at the top level takes its file whole) comes from, sorted."""
    return sorted(taken.path for taken in _closure(paths, tuple(definitions)))


def code_closure_hash(*paths: Path, definitions: Iterable[tuple[Path, str]] = ()) -> str:
    """The hash of the code of the modules `paths` (whole) and of the `definitions` (file,
    qualified name; one not at the top level takes its file whole), with what they use (see
    the module's docstring)."""
    closure = _closure(paths, tuple(definitions))
    key = _text_hash("".join(f"{taken.module}:{taken.text_hash}:{taken.units};"
                             for taken in closure))
    known = _memo.closures.get(key)
    if known is not None:
        return known
    digest = hashlib.sha256()
    for taken in closure:
        whole, units, _ = _analysed(taken.text)
        code = whole if taken.units is None else "".join(units[i] for i in taken.units)
        digest.update(f"{taken.module}\n{code}\n".encode())
    _memo.closures[key] = digest.hexdigest()[:16]
    _memo.save()
    return _memo.closures[key]


def remember_in(path: Path) -> None:
    """Keep this process's worked-out file structures and closure hashes in the file `path`
    (read now, written as they grow); where it cannot be read, start empty, and where it cannot
    be written, keep them in this process only."""
    global _memo
    _memo = _Memo.read(Path(path))


def _closure(paths: tuple[Path, ...], definitions: tuple[tuple[Path, str], ...]
             ) -> list[_Taken]:
    """The files of the code closure and what it takes of each, sorted by module name."""
    paths = tuple(path.resolve() for path in paths)
    definitions = tuple((path.resolve(), name) for path, name in definitions)
    # Each root folder with its package name, found once per closure.
    roots = {root: _package_name(root) for root in (
        *(path.parent for path in paths), *(path.parent for path, _ in definitions),
        KERNELS_DIR, KERNELS_DIR / "device")}
    files: dict[Path, tuple[str, str, _Structure]] = {}
    whole: set[Path] = set()
    taken: dict[Path, set[int]] = {}
    # Requests (file, top-level name or None for the whole file, attribute read of the name).
    # A definition nested in a function or class (a dotted qualified name) takes its file whole.
    pending: list[tuple[Path, str | None, str | None]] = [
        *((path, None, None) for path in paths),
        *((path, None if "." in name else name, None) for path, name in definitions)]
    seen = set()
    while pending:
        request = pending.pop()
        path, name, attribute = request
        if request in seen or path in whole:
            continue
        seen.add(request)
        if path not in files:
            text = path.read_text()
            text_hash = _text_hash(text)
            files[path] = text, text_hash, _structure(text, text_hash)
            taken[path] = set()
        structure = files[path][2]
        if name is None or structure.device:
            # Every definition counts, so only what the file imports leads further.
            whole.add(path)
            for unit in structure.units:
                for dotted in (*unit.imports, *([unit.alias] if unit.alias else [])):
                    pending += _requests(dotted, None, roots)
            continue
        for index, unit in enumerate(structure.units):
            if name not in unit.names:
                continue
            if unit.alias:
                pending += _requests(unit.alias, attribute, roots)
            elif index not in taken[path]:
                pending += [(path, used, read) for used, read in unit.uses]
                for dotted in unit.imports:
                    pending += _requests(dotted, None, roots)
            taken[path].add(index)
    for path, name in definitions:
        if "." not in name and not any(name in unit.names for unit in files[path][2].units):
            raise LookupError(f"{path} has no top-level definition of {name!r}")
    return sorted((_Taken(_module_name(path, roots), path, text, text_hash,
                          None if path in whole else tuple(sorted(taken[path])))
                   for path, (text, text_hash, _) in files.items()
                   if path in whole or taken[path]), key=lambda taken: taken.module)


def _requests(dotted: str, attribute: str | None, roots: dict[Path, str]
              ) -> list[tuple[Path, str | None, str | None]]:
    """What an imported `dotted` name leads to: a module of code, read as `attribute` (its
    definition of that name) or whole (None); a name in a module of code; or nothing."""
    module = _module_file(dotted, roots)
    if module is not None:
        return [] if module in NOT_CODE else [(module, attribute, None)]
    parent, _, name = dotted.rpartition(".")
    module = _module_file(parent, roots) if parent else None
    return [] if module is None or module in NOT_CODE else [(module, name, None)]


def _structure(text: str, text_hash: str) -> _Structure:
    known = _memo.files.get(text_hash)
    if known is None:
        known = _memo.files[text_hash] = _analysed(text)[2]
    device, units = known
    return _Structure(device, tuple(_Unit(*unit) for unit in units))


def _text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# What a memo's answers depend on besides the texts: this module's code and the parser's.
_MEMO_VERSION = _text_hash(f"{Path(__file__).read_text()}{sys.version_info[:2]}")


class _Memo:
    """The structures of file texts and the hashes of closures, by the hashes of texts."""

    def __init__(self, path: Path | None = None, files: dict | None = None,
                 closures: dict | None = None):
        self.path, self.files, self.closures = path, files or {}, closures or {}

    @classmethod
    def read(cls, path: Path) -> _Memo:
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls(path)
        if not isinstance(stored, dict) or stored.get("version") != _MEMO_VERSION:
            return cls(path)
        return cls(path, stored.get("files"), stored.get("closures"))

    def save(self) -> None:
        """Written whole (atomic_file); where several processes write, the last one's answers
        stay and the others' are worked out again."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, json.dumps({
                "version": _MEMO_VERSION, "files": self.files,
                "closures": self.closures}).encode())
        except OSError:
            self.path = None


_memo = _Memo()


@functools.lru_cache(maxsize=512)
def _analysed(text: str) -> tuple[str, tuple[str, ...], _Structure]:
    """A file's code as hashed whole, the code of each of its top-level definitions, and its
    structure, from one parse, worked out once per process and text: the kernels of a model
    share most of their closures."""
    tree = ast.parse(text)
    whole = _code_of(tree)
    units = _units(tree)
    device = any(name == CUTEDSL or name.startswith(CUTEDSL + ".")
                 for name in _imports_within(tree))
    return (whole, tuple(_canonical(node) for node, _ in units),
            _Structure(device, tuple(unit for _, unit in units)))


def _code_of(tree: ast.Module) -> str:
    """The tree as text without its docstrings (which it drops from the tree); comments are not
    in a syntax tree at all."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return _canonical(tree)


def _canonical(node: object) -> str:
    """A syntax tree as text that every Python version writes alike, so that a winner tuned
    under one interpreter is served under another: each node's type and the fields that hold
    something. `ast.dump` does not do this: 3.12 adds empty type_params to every function and
    class, and 3.13 leaves empty fields out."""
    if isinstance(node, ast.AST):
        fields = ", ".join(f"{name}={_canonical(value)}" for name in node._fields
                           if (value := getattr(node, name, None)) is not None and value != [])
        return f"{type(node).__name__}({fields})"
    if isinstance(node, list):
        return f"[{', '.join(_canonical(item) for item in node)}]"
    return repr(node)


def _units(tree: ast.Module) -> list[tuple[ast.AST, _Unit]]:
    """The module's top-level definitions with their syntax: each statement, but an import of
    several names is one definition per name, so that importing one name more changes none of
    the others."""
    units = []
    for statement in tree.body:
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                # `import a.b` binds a, not the module a.b: followed whole, never by attribute.
                exact = alias.asname is not None or "." not in alias.name
                units.append((ast.Import(names=[alias]), _Unit(
                    (alias.asname or alias.name.partition(".")[0],), (),
                    () if exact else (alias.name,), alias.name if exact else None)))
        elif isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
            for alias in statement.names:
                units.append((ast.ImportFrom(module=statement.module, names=[alias], level=0),
                              _Unit((alias.asname or alias.name,), (), (),
                                    f"{statement.module}.{alias.name}")))
        else:
            units.append((statement, _Unit(_bound(statement), _uses(statement),
                                           tuple(sorted(_imports_within(statement))), None)))
    return units


def _bound(statement: ast.stmt) -> tuple[str, ...]:
    """The top-level names a statement binds: a function's or class's name, an assignment's
    targets, any name a compound statement (if, try, with) stores."""
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return (statement.name,)
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, ast.AnnAssign | ast.AugAssign):
        targets = [statement.target]
    else:
        targets = [statement]
    return tuple(sorted({node.id for target in targets for node in ast.walk(target)
                         if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}))


def _uses(statement: ast.stmt) -> tuple[tuple[str, str | None], ...]:
    """Every name the statement's code reads, each with the attribute read of it where it is
    read as `name.attribute` (None elsewhere). A read of a local that shares a top-level name
    counts too: the closure then takes that definition, which costs a spurious change of the
    hash at most, never a missed one. A name stored to (a class's field) reads nothing."""
    read = {id(node.value): node.attr for node in ast.walk(statement)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)}
    return tuple(sorted({(node.id, read.get(id(node))) for node in ast.walk(statement)
                         if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)},
                        key=repr))


def _imports_within(node: ast.AST) -> set[str]:
    """The dotted names imported anywhere in `node`: modules, and a module's names as
    module.name (a kernel may import inside a function)."""
    names = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Import):
            names.update(alias.name for alias in inner.names)
        elif isinstance(inner, ast.ImportFrom) and inner.module and not inner.level:
            names.update(f"{inner.module}.{alias.name}" for alias in inner.names)
    return names


def _module_file(name: str, roots: dict[Path, str]) -> Path | None:
    """The file of a module `name` that lies directly in one of `roots` (folders, with their
    package names); None for anything else (other packages' modules, attributes, packages).
    Found from the name and the roots' package names alone: looking a module up (importlib's
    find_spec) imports its parent packages, and a peer's (liger_kernel.ops) pulls in
    transformers and torch._dynamo, seconds of a warmup that needs none of them."""
    for root, package in roots.items():
        if package and not name.startswith(package + "."):
            continue
        rest = name[len(package) + 1:] if package else name
        candidate = root / f"{rest}.py"
        if "." not in rest and candidate.is_file():
            return candidate
    return None


def _module_name(path: Path, roots: dict[Path, str]) -> str:
    """A closure file's dotted module name: the same wherever the package is installed."""
    package = roots[path.parent]
    return f"{package}.{path.stem}" if package else path.stem


def _package_name(directory: Path) -> str:
    """The dotted package name of a folder, from the __init__.py files above it ('' where it is
    no package)."""
    parts = []
    while (directory / "__init__.py").is_file():
        parts.insert(0, directory.name)
        directory = directory.parent
    return ".".join(parts)

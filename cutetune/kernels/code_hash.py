"""The hash that ties a stored winner to the code that produced it.

A kernel's binary depends on its module and on the helper modules it imports for code generation
(cache_hints, moe_common, ...), so the hash covers all of them: the kernel's file and, followed
through its imports (those inside functions too: a kernel imports its device code only to
compile), every module that lives in the kernel's own folder, in cutetune/kernels/ or in
cutetune/kernels/device/, but the registry and this module, which declare and hash kernels and
generate no code. Each file is hashed from its syntax tree with comments and
docstrings left out: editing a comment keeps the winners, changing a helper's code drops those of
every kernel that uses it.

Parsing a closure's files is most of a warm warmup's time after the loads, so a process may keep
what it worked out in a file (`remember_in`): each file's imports by the hash of its text, and
each closure's hash by the hashes of its files' texts. A later process reads the texts, hashes
them and looks the rest up; the keys include this module's own text and the Python version, so
a change of the hashing or of the parser is never served an old answer.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import sys
from pathlib import Path

from cutetune.atomic_file import write_atomically

KERNELS_DIR = Path(__file__).resolve().parent
# The memo's file name in the artifact cache (cleared with it).
CODE_HASHES = "code-hashes.json"
NOT_CODE = {KERNELS_DIR / "registry.py", Path(__file__).resolve()}


def code_closure(*paths: Path) -> list[Path]:
    """The kernel's files (its declaration, its device code) and the modules their code comes
    from, sorted."""
    return sorted(_closure_files(*paths))


def code_closure_hash(*paths: Path) -> str:
    files = sorted(_closure_files(*paths).items())
    key = _text_hash("".join(f"{module.name}:{text_hash};"
                             for module, (_, text_hash) in files))
    known = _memo.closures.get(key)
    if known is not None:
        return known
    digest = hashlib.sha256()
    for module, (text, _) in files:
        digest.update(module.name.encode())
        digest.update(_analysed(text)[0].encode())
    _memo.closures[key] = digest.hexdigest()[:16]
    _memo.save()
    return _memo.closures[key]


def remember_in(path: Path) -> None:
    """Keep this process's worked-out imports and closure hashes in the file `path` (read now,
    written as they grow); where it cannot be read, start empty, and where it cannot be
    written, keep them in this process only."""
    global _memo
    _memo = _Memo.read(Path(path))


def _closure_files(*paths: Path) -> dict[Path, tuple[str, str]]:
    """Each file of the code closure of `paths` with its text and the hash of its text."""
    paths = tuple(path.resolve() for path in paths)
    # Each root folder with its package name, found once per closure.
    roots = {root: _package_name(root) for root in (
        *(path.parent for path in paths), KERNELS_DIR, KERNELS_DIR / "device")}
    files: dict[Path, tuple[str, str]] = {}
    pending = list(paths)
    while pending:
        current = pending.pop()
        if current in files:
            continue
        text = current.read_text()
        files[current] = text, _text_hash(text)
        for name in _imports(*files[current]):
            found = _module_file(name, roots)
            if found is not None and found not in NOT_CODE:
                pending.append(found)
    return files


def _imports(text: str, text_hash: str) -> list[str]:
    known = _memo.imports.get(text_hash)
    if known is None:
        known = _memo.imports[text_hash] = _analysed(text)[1]
    return known


def _text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# What a memo's answers depend on besides the texts: this module's code and the parser's.
_MEMO_VERSION = _text_hash(f"{Path(__file__).read_text()}{sys.version_info[:2]}")


class _Memo:
    """The imports of file texts and the hashes of closures, by the hashes of texts."""

    def __init__(self, path: Path | None = None, imports: dict | None = None,
                 closures: dict | None = None):
        self.path, self.imports, self.closures = path, imports or {}, closures or {}

    @classmethod
    def read(cls, path: Path) -> _Memo:
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls(path)
        if not isinstance(stored, dict) or stored.get("version") != _MEMO_VERSION:
            return cls(path)
        return cls(path, stored.get("imports"), stored.get("closures"))

    def save(self) -> None:
        """Written whole (atomic_file); where several processes write, the last one's answers
        stay and the others' are worked out again."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, json.dumps({
                "version": _MEMO_VERSION, "imports": self.imports,
                "closures": self.closures}).encode())
        except OSError:
            self.path = None


_memo = _Memo()


@functools.lru_cache(maxsize=512)
def _analysed(text: str) -> tuple[str, list[str]]:
    """A file's code as hashed and the modules it imports, from one parse, worked out once per
    process and text: the kernels of a model share most of their closures."""
    tree = ast.parse(text)
    imported = sorted(_imported_modules(tree))
    return _code_of(tree), imported


def _code_of(tree: ast.Module) -> str:
    """The tree as text without its docstrings; comments are not in a syntax tree at all."""
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


def _imported_modules(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
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


def _package_name(directory: Path) -> str:
    """The dotted package name of a folder, from the __init__.py files above it ('' where it is
    no package)."""
    parts = []
    while (directory / "__init__.py").is_file():
        parts.insert(0, directory.name)
        directory = directory.parent
    return ".".join(parts)

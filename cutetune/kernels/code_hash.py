"""The hash that ties a stored winner to the code that produced it.

A kernel's binary depends on its module and on the helper modules it imports for code generation
(cache_hints, moe_common, ...), so the hash covers all of them: the kernel's file and, followed
through its imports (those inside functions too: a kernel imports its device code only to
compile), every module that lives in the kernel's own folder, in cutetune/kernels/ or in
cutetune/kernels/device/, but the registry and this module, which declare and hash kernels and
generate no code. Each file is hashed from its syntax tree with comments and
docstrings left out: editing a comment keeps the winners, changing a helper's code drops those of
every kernel that uses it.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parent
NOT_CODE = {KERNELS_DIR / "registry.py", Path(__file__).resolve()}


def code_closure(*paths: Path) -> list[Path]:
    """The kernel's files (its declaration, its device code) and the modules their code comes
    from, sorted."""
    return sorted(_closure_codes(*paths))


def code_closure_hash(*paths: Path) -> str:
    digest = hashlib.sha256()
    for module, code in sorted(_closure_codes(*paths).items()):
        digest.update(module.name.encode())
        digest.update(code.encode())
    return digest.hexdigest()[:16]


def _closure_codes(*paths: Path) -> dict[Path, str]:
    """Each file of the code closure of `paths` with its code as hashed."""
    paths = tuple(path.resolve() for path in paths)
    # Each root folder with its package name, found once per closure.
    roots = {root: _package_name(root) for root in (
        *(path.parent for path in paths), KERNELS_DIR, KERNELS_DIR / "device")}
    codes: dict[Path, str] = {}
    pending = list(paths)
    while pending:
        current = pending.pop()
        if current in codes:
            continue
        codes[current], imported = _file_code(current.read_text())
        for name in imported:
            found = _module_file(name, roots)
            if found is not None and found not in NOT_CODE:
                pending.append(found)
    return codes


@functools.lru_cache(maxsize=512)
def _file_code(text: str) -> tuple[str, frozenset[str]]:
    """A file's code as hashed and the modules it imports, worked out once per process and
    text: the kernels of a model share most of their closures, and parsing is most of the
    cost of a warmup from the artifact cache after the loads."""
    tree = ast.parse(text)
    imported = frozenset(_imported_modules(tree))
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

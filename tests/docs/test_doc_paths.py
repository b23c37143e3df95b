"""The docs name files and modules that exist: every path, module and `path` `function` pair in
README.md, docs/*.md and BENCHMARKS.md (whose hand-written part is benchmarks/targets.md) is
checked against the tree, so a move or a rename that leaves a doc behind fails here rather than
misleading a reader. README.md and docs/*.md also hold no commit hash (the measurements' commits
are BENCHMARKS.md's, from benchmarks/results/index.csv), and README.md stays under 8 KB.

What is checked, outside fenced code blocks:
- a path in a code span or in prose (`cutetune/serving/plan.py`, `tests/data/hf_configs`,
  `benchmarks/results/`), from the repository root, else from the package (`serving/plan.py`,
  as docs/architecture.md writes them); a `*` is a glob; a name with `<`, `$`, `~` or `:` in
  it is a placeholder or a place outside the tree (`<cache dir>/artifacts`), not checked;
- a bare file name in a code span (`fast_path.cc`, `space.py`): some file of the tree has it;
- a dotted name in a code span that starts with `cutetune.` (`cutetune.ops.serve`,
  `cutetune.rmsnorm`): it imports, or is an attribute of what does;
- a path in a code span followed by a name in a code span (`tuner/tune.py` `plan_bucket`,
  `device/funnel.py`: `make_plan`): the file defines that name;
- a relative link target ([cli](docs/cli.md)): the file exists.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "cutetune"
WRITTEN = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
DOCS = [*WRITTEN, ROOT / "BENCHMARKS.md"]
# A word of 7 to 40 hex digits with a letter and a digit in it: an abbreviated commit hash.
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
README_MAX_BYTES = 8 * 1024

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PROSE_PATH = re.compile(r"(?<![\w./-])((?:cutetune|tests|benchmarks|docs|notebooks)/[\w./*-]*\w/?)")
TOP = ("cutetune", "tests", "benchmarks", "docs", "notebooks", ".ci")
FILE_SUFFIXES = (".py", ".cc", ".ipynb", ".sh", ".md")
# A dotted name that ends so is a file's name (`cutetune.db`), not a module's.
NOT_MODULES = (".db", ".json", ".html", ".csv")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
# A path's span, then (after spaces or a line break, a colon before them or not) a name's span.
PATH_THEN_NAME = re.compile(r"`([\w./-]+\.py)`:?\s+`([A-Za-z_][\w.]*)`")


def _text(path: Path) -> str:
    return FENCE.sub("", path.read_text())


def _is_placeholder(name: str) -> bool:
    return any(c in name for c in "<>$~:") or name.startswith("http")


def _looks_like_path(span: str) -> bool:
    return (" " not in span and not _is_placeholder(span)
            and ("/" in span or span.endswith(FILE_SUFFIXES)))


def _resolve(name: str) -> Path | None:
    """The file or folder `name` names: from the root, else from the package; None if none."""
    bases = (ROOT,) if name.split("/")[0] in TOP else (ROOT, PACKAGE)
    for base in bases:
        if "*" in name:
            if any(base.glob(name.rstrip("/"))):
                return base
            continue
        candidate = base / name
        if candidate.exists() and (not name.endswith("/") or candidate.is_dir()):
            return candidate
    return None


def _tree_file_names() -> set[str]:
    """The names of the tree's files, and of its folders with a slash after them."""
    return {p.name + ("/" if p.is_dir() else "")
            for top in ("cutetune", "tests", "benchmarks") for p in (ROOT / top).rglob("*")}


def problems_in(doc: Path, file_names: set[str]) -> list[str]:
    """What `doc` names that does not exist, one line each."""
    text = _text(doc)
    spans = SPAN.findall(text)
    problems = []
    paths = {s for s in spans if _looks_like_path(s)}
    paths |= set(PROSE_PATH.findall(SPAN.sub("", text)))
    for name in sorted(paths):
        if "/" in name.rstrip("/"):
            if _resolve(name) is None:
                problems.append(f"no file or folder {name}")
        elif name.endswith("/"):
            if name not in file_names and _resolve(name) is None:
                problems.append(f"no folder named {name}")
        elif name not in file_names and _resolve(name) is None:
            problems.append(f"no file named {name}")
    for span in sorted(set(spans)):
        if (span.startswith("cutetune.") and IDENTIFIER.fullmatch(span)
                and not span.endswith(NOT_MODULES)):
            if not _imports(span):
                problems.append(f"no module or attribute {span}")
    for path, name in sorted(set(PATH_THEN_NAME.findall(text))):
        file = _resolve(path)
        if file is not None and file.is_file() and not _defines(file, name):
            problems.append(f"{path} defines no {name}")
    for target in sorted(set(LINK.findall(text))):
        if _is_placeholder(target) or target.startswith("#"):
            continue
        if not (doc.parent / target.split("#")[0]).exists():
            problems.append(f"link to missing {target}")
    return problems


def _imports(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                value = getattr(value, attribute)
        except AttributeError:
            return False
        return True
    return False


def _defines(file: Path, dotted: str) -> bool:
    """Whether `file` defines each part of `dotted` (a function, a class, a method, or a name
    assigned or annotated at the start of a line: a constant, a dataclass field)."""
    source = file.read_text()
    return all(re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{part}\b|^\s*{part}\s*[:=]",
                         source, re.M)
               for part in dotted.split("."))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_in_the_docs_exists(doc):
    assert problems_in(doc, _tree_file_names()) == []


@pytest.mark.parametrize("doc", WRITTEN, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_commit_hash_in_the_written_docs(doc):
    assert COMMIT_HASH.findall(doc.read_text()) == []


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_bytes()) <= README_MAX_BYTES


def test_a_commit_hash_is_caught():
    assert COMMIT_HASH.findall("at `0c0d6b2`, 2026-12-02, 1234567 calls, cafebabe") == ["0c0d6b2"]


def test_a_missing_name_is_caught(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("The plan is `cutetune/dispatch.py`, served from `tuner/plan.py`, in\n"
                   "cutetune/serving/nowhere.py; `cutetune.serving.nothing`, `tuner/tune.py`\n"
                   "`no_such_function`, `no_file.py` and [a link](missing.md).\n"
                   "```\ncutetune/fenced/code/is/not/checked.py\n```\n"
                   "`<cache dir>/artifacts/` is a place outside the tree, `serving/plan.py`\n"
                   "`ServingPlan` and `cutetune.ops.serve` are right.\n")
    assert problems_in(doc, _tree_file_names()) == [
        "no file or folder cutetune/dispatch.py",
        "no file or folder cutetune/serving/nowhere.py",
        "no file named no_file.py",
        "no file or folder tuner/plan.py",
        "no module or attribute cutetune.serving.nothing",
        "tuner/tune.py defines no no_such_function",
        "link to missing missing.md",
    ]

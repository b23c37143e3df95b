"""Compiled points as files: one process compiles and exports a point, another loads it.

Every point cutetune runs comes through here: the tuner's compile processes store what its GPU
worker times, and the dispatcher and the bench load a stored point instead of compiling it
again (`get`). An artifact is the object file CuTeDSL's `export_to_c` writes for one point,
with a JSON manifest beside it saying which point it is (for `cutetune cache ls`). Its name is
a digest of everything the binary depends on (kernel and its source, static problem, config,
target arch, the CuTeDSL and TVM-FFI versions, the host platform) followed by a digest of its
content: a file is written under a temporary name and renamed, so a reader never sees half a
file and processes compiling the same point do not clash, and a file whose content does not
match its name (truncated, or written by something else) is deleted and compiled again, never
run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from cutetune.kernels.registry import KernelDef
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import config_to_json


def arch_for(compute_capability: str) -> str:
    """CuTeDSL's target name for a compute capability: "9.0" -> "sm_90a". The "a" variants
    carry the architecture-specific instructions (wgmma, bulk copies) the kernels may use."""
    major, minor = compute_capability.split(".")
    return f"sm_{major}{minor}a"


@functools.cache
def _toolchain() -> str:
    versions = [f"{name}={metadata.version(name)}"
                for name in ("nvidia-cutlass-dsl", "apache-tvm-ffi")]
    return " ".join([*versions, platform.system(), platform.machine()])


def _digest(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


@dataclass
class CacheCounts:
    """What a store did in this process: points loaded from it, points compiled into it, and
    unsound files (truncated, or not what their name says) deleted and compiled again; and the
    seconds loading and compiling took, which a warmup's report shows."""

    loaded: int = 0
    compiled: int = 0
    unsound: int = 0
    load_s: float = 0.0
    compile_s: float = 0.0


@dataclass(frozen=True)
class ArtifactStore:
    """A directory of compiled points for one target arch."""

    directory: Path
    arch: str
    counts: CacheCounts = field(default_factory=CacheCounts, compare=False)

    def writable(self) -> bool:
        """Whether artifacts can be stored here (the directory is created if need be)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.directory):
                return True
        except OSError:
            return False

    def key(self, kernel: KernelDef, problem: Problem, config: Any) -> str:
        """The digest of everything the point's binary depends on."""
        return _digest("\n".join((kernel.name, kernel.source_hash(), problem.static_key(),
                                  config_to_json(config), self.arch, _toolchain())))[:32]

    def find(self, kernel: KernelDef, problem: Problem, config: Any) -> Path | None:
        """The point's artifact if a sound one is stored; an unsound one is deleted."""
        for path in self.directory.glob(f"{self.key(kernel, problem, config)}-*.o"):
            if _digest(path.read_bytes())[:16] == _name_parts(path)[1]:
                return path
            path.unlink(missing_ok=True)
            self.counts.unsound += 1
        return None

    def stored_keys(self) -> set[str]:
        """The keys of the artifacts stored here, from the file names alone (`find` checks a
        file's content when it is needed)."""
        if not self.directory.is_dir():
            return set()
        return {_name_parts(path)[0] for path in self.directory.glob("*-*.o")}

    def compile(self, kernel: KernelDef, problem: Problem, config: Any) -> Path:
        """Compile the point in this process for `arch` and store its artifact. The arch is
        passed to the compiler: CuTeDSL reads CUTE_DSL_ARCH once, when it is imported, and
        otherwise asks the driver, which in a process that sees no GPU answers its default
        (sm_100)."""
        return self._compile_and_store(kernel, problem, config)[0]

    def get(self, kernel: KernelDef, problem: Problem, config: Any) -> Any:
        """The point ready to launch: loaded from its stored artifact, else compiled in this
        process and stored for the next."""
        start = time.perf_counter()
        loaded = self.load(kernel, problem, config)
        if loaded is not None:
            self.counts.loaded += 1
            self.counts.load_s += time.perf_counter() - start
            return loaded
        function = self._compile_and_store(kernel, problem, config)[1]
        return kernel.bound(problem, config, function)

    def _compile_and_store(self, kernel: KernelDef, problem: Problem,
                           config: Any) -> tuple[Path, Any]:
        start = time.perf_counter()
        key = self.key(kernel, problem, config)
        function = kernel.compile_function(problem, config, f"--gpu-arch {self.arch}")
        self.directory.mkdir(parents=True, exist_ok=True)
        manifest = {"kernel": kernel.name, "source_hash": kernel.source_hash(),
                    "problem": problem.describe(), "static_key": problem.static_key(),
                    "config": config_to_json(config), "arch": self.arch,
                    "toolchain": _toolchain()}
        _write_atomically(self.directory / f"{key}.json", json.dumps(manifest).encode())
        descriptor, temporary = tempfile.mkstemp(suffix=".o", dir=self.directory)
        os.close(descriptor)
        try:
            function.export_to_c(temporary, function_name=_function_name(key),
                                 export_only_tvm_ffi_symbols=True)
            final = self.directory / f"{key}-{_digest(Path(temporary).read_bytes())[:16]}.o"
            os.replace(temporary, final)
        finally:
            Path(temporary).unlink(missing_ok=True)
        self.counts.compiled += 1
        self.counts.compile_s += time.perf_counter() - start
        return final, function

    def entries(self) -> list[dict[str, Any]]:
        """Every stored artifact's manifest, with its file and size; for `cutetune cache ls`."""
        found = []
        for path in sorted(self.directory.glob("*-*.o")):
            manifest_file = path.with_name(f"{_name_parts(path)[0]}.json")
            try:
                manifest = json.loads(manifest_file.read_text())
            except (OSError, ValueError):
                manifest = {}
            found.append({**manifest, "file": path.name, "bytes": path.stat().st_size})
        return found

    def load(self, kernel: KernelDef, problem: Problem, config: Any) -> Any | None:
        """The point's stored artifact loaded into this process, bound as `launch` takes it;
        None where no sound artifact is stored."""
        path = self.find(kernel, problem, config)
        if path is None:
            return None
        import cutlass.cute as cute

        module = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
        function = getattr(module, _function_name(_name_parts(path)[0]))
        return kernel.bound(problem, config, function)


ARTIFACTS_DIR = "artifacts"  # under the settings' cache dir; the key names the arch


def clear_artifacts(directory: Path) -> int:
    """Delete every artifact and manifest in `directory` (of every arch); the count of files."""
    removed = 0
    for path in [*directory.glob("*-*.o"), *directory.glob("*.json")]:
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def _write_atomically(path: Path, data: bytes) -> None:
    descriptor, temporary = tempfile.mkstemp(dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    finally:
        Path(temporary).unlink(missing_ok=True)


def _name_parts(path: Path) -> tuple[str, str]:
    """An artifact file's (key, content digest), from its name `{key}-{digest}.o`."""
    key, content = path.stem.rsplit("-", 1)
    return key, content


def _function_name(key: str) -> str:
    # One symbol per artifact: a process that loads several points must not see two functions
    # of one name.
    return f"cutetune_{key}"

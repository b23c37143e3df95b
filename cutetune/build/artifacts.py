"""Compiled points as files: one process compiles and exports a point, another loads it.

Every point cutetune runs comes through here: the tuner's compile processes store what its GPU
worker times, and the dispatcher and the bench load a stored point instead of compiling it
again (`get`). An artifact is a shared library: the object file CuTeDSL's `export_to_c` writes
for one point, linked by the C compiler (`cc`, or $CC) against CuTeDSL's runtime library and
tvm-ffi's, with a JSON manifest beside it saying which point it is (for `cutetune cache ls`).
tvm-ffi loads it (`tvm_ffi.load_module`) without importing CuTeDSL, whose import costs seconds
that a warmup from the cache would otherwise spend; the artifact names those libraries without
a path, and the loading process loads them first, from where this installation has them (found
by CuTeDSL once and recorded in the directory, RUNTIME_LIBRARIES).

Its name is a digest of everything the binary depends on (kernel and its source, static
problem, config, target arch, the CuTeDSL and TVM-FFI versions, the host platform) followed by
a digest of its content: a file is written under a temporary name and renamed, so a reader
never sees half a file and processes compiling the same point do not clash, and a file whose
content does not match its name (truncated, or written by something else), or that does not
load, is deleted and compiled again, never run.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from cutetune.atomic_file import write_atomically
from cutetune.build.publish import find_published, publish
from cutetune.kernels.registry import KernelDef
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import config_to_json

log = logging.getLogger("cutetune.artifacts")


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


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


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


@dataclass
class _Listing:
    """The artifact files of a directory by key, from one reading of it."""

    by_key: dict[str, list[Path]] | None = None


@dataclass(frozen=True)
class ArtifactStore:
    """A directory of compiled points for one target arch."""

    directory: Path
    arch: str
    counts: CacheCounts = field(default_factory=CacheCounts, compare=False)
    # Read once, at the first lookup: a warmup looks up every point it serves, and searching a
    # cache of thousands of files (a tuned host's) for each took seconds. A point stored since
    # is found by searching for it alone (`find_published`).
    _listing: _Listing = field(default_factory=_Listing, compare=False, repr=False)

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
        key = self.key(kernel, problem, config)
        path, unsound = find_published(self.directory / key,
                                       listed=self._listed().get(key, ()))
        self.counts.unsound += len(unsound)
        return path

    def stored_keys(self) -> set[str]:
        """The keys of the artifacts stored here, from the file names alone (`find` checks a
        file's content when it is needed); the directory is read now, and the later lookups
        use this reading."""
        self._listing.by_key = None
        return set(self._listed())

    def _listed(self) -> dict[str, list[Path]]:
        if self._listing.by_key is None:
            by_key: dict[str, list[Path]] = {}
            if self.directory.is_dir():
                for path in self.directory.glob("*-*.so"):
                    by_key.setdefault(_name_parts(path)[0], []).append(path)
            self._listing.by_key = by_key
        return self._listing.by_key

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
        compiler = c_compiler()
        if compiler is None:
            raise ArtifactError(NO_COMPILER)
        function = kernel.compile_function(problem, config, f"--gpu-arch {self.arch}")
        self.directory.mkdir(parents=True, exist_ok=True)
        manifest = {"kernel": kernel.name, "source_hash": kernel.source_hash(),
                    "problem": problem.describe(), "static_key": problem.static_key(),
                    "config": config_to_json(config), "arch": self.arch,
                    "toolchain": _toolchain()}
        write_atomically(self.directory / f"{key}.json", json.dumps(manifest).encode())
        libraries = runtime_libraries(self.directory)

        def build(library: Path) -> None:
            exported = library.with_suffix(".o")
            function.export_to_c(str(exported), function_name=_function_name(key),
                                 export_only_tvm_ffi_symbols=True)
            _link(compiler, exported, library, libraries)

        final = publish(self.directory / key, build)
        self.counts.compiled += 1
        self.counts.compile_s += time.perf_counter() - start
        return final, function

    def entries(self) -> list[dict[str, Any]]:
        """Every stored artifact's manifest, with its file and size; for `cutetune cache ls`."""
        found = []
        for path in sorted(self.directory.glob("*-*.so")):
            manifest_file = path.with_name(f"{_name_parts(path)[0]}.json")
            try:
                manifest = json.loads(manifest_file.read_text())
            except (OSError, ValueError):
                manifest = {}
            found.append({**manifest, "file": path.name, "bytes": path.stat().st_size})
        return found

    def load(self, kernel: KernelDef, problem: Problem, config: Any) -> Any | None:
        """The point's stored artifact loaded into this process, bound as `launch` takes it;
        None where no sound artifact is stored (one that does not load is deleted)."""
        path = self.find(kernel, problem, config)
        if path is None:
            return None
        import tvm_ffi

        _load_runtime_libraries(self.directory)
        try:
            function = tvm_ffi.load_module(str(path))[_function_name(_name_parts(path)[0])]
        except (OSError, RuntimeError, AttributeError, KeyError) as err:
            log.warning("cutetune: the artifact %s does not load (%s); compiling it again",
                        path.name, str(err).splitlines()[0] if str(err) else type(err).__name__)
            path.unlink(missing_ok=True)
            self.counts.unsound += 1
            return None
        return kernel.bound(problem, config, function)


class ArtifactError(RuntimeError):
    """An artifact cannot be made here (no C compiler to link it)."""


NO_COMPILER = ("no C compiler found (cc, or the one $CC names) to link compiled points into "
               "the artifact cache's shared libraries: install one (gcc, which Triton and "
               "torch.compile need too)")


def c_compiler() -> str | None:
    """The C compiler that links artifacts: $CC, else cc; None where neither is found."""
    return shutil.which(os.environ.get("CC") or "cc")


def _link(compiler: str, exported: Path, library: Path, libraries: list[str]) -> None:
    """Link the exported object into a shared library that needs `libraries` by file name
    only (no path is recorded: the loading process loads them first, from its own
    installation)."""
    arguments = [compiler, "-shared", "-o", str(library), str(exported)]
    for runtime in map(Path, libraries):
        arguments += [f"-L{runtime.parent}", f"-l:{runtime.name}"]
    done = subprocess.run(arguments, capture_output=True, text=True)
    if done.returncode:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ArtifactError(f"linking an artifact with {compiler} failed: "
                            f"{said[-1] if said else f'exit status {done.returncode}'}")


RUNTIME_LIBRARIES = "runtime-libraries.json"
# The runtime libraries this process has loaded (their handles kept, so they stay loaded).
_loaded_runtime: list[ctypes.CDLL] = []


def runtime_libraries(directory: Path) -> list[str]:
    """The shared libraries every artifact needs (CuTeDSL's runtime, tvm-ffi's), as this
    installation has them: read from the record in `directory` when it names this
    installation (its Python prefix and toolchain) and the files are there, else found by
    CuTeDSL, which costs its import, and recorded."""
    record = directory / RUNTIME_LIBRARIES
    here = {"prefix": sys.prefix, "toolchain": _toolchain()}
    try:
        stored = json.loads(record.read_text())
        if all(stored.get(name) == value for name, value in here.items()) and all(
                Path(library).is_file() for library in stored["libraries"]):
            return stored["libraries"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from cutlass.cute.runtime import find_runtime_libraries

    libraries = [str(Path(library).resolve())
                 for library in find_runtime_libraries(enable_tvm_ffi=True)]
    directory.mkdir(parents=True, exist_ok=True)
    write_atomically(record, json.dumps({**here, "libraries": libraries}).encode())
    return libraries


def _load_runtime_libraries(directory: Path) -> None:
    """Load the artifacts' runtime libraries into this process, once (not at every artifact a
    warmup loads): an artifact names them by file name, which the dynamic loader then finds
    loaded."""
    if not _loaded_runtime:
        _loaded_runtime.extend(map(ctypes.CDLL, runtime_libraries(directory)))


ARTIFACTS_DIR = "artifacts"  # under the settings' cache dir; the key names the arch


def clear_artifacts(directory: Path) -> int:
    """Delete every artifact and manifest in `directory` (of every arch); the count of files."""
    removed = 0
    for path in [*directory.glob("*-*.so"), *directory.glob("*.json")]:
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def _name_parts(path: Path) -> tuple[str, str]:
    """An artifact file's (key, content digest), from its name `{key}-{digest}.so`."""
    key, content = path.stem.rsplit("-", 1)
    return key, content


def _function_name(key: str) -> str:
    # One symbol per artifact: a process that loads several points must not see two functions
    # of one name.
    return f"cutetune_{key}"

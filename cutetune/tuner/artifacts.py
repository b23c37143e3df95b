"""Compiled points as files: one process compiles and exports a point, another loads it.

The tuner compiles in CPU-only processes while its GPU worker times what they wrote. An artifact
is the object file CuTeDSL's `export_to_c` writes for one point. Its name is a digest of
everything the binary depends on (kernel and its source, static problem, config, target arch,
the CuTeDSL and TVM-FFI versions, the host platform) followed by a digest of its content: a file
is written under a temporary name and renamed, so a reader never sees half a file and processes
compiling the same point do not clash, and a file whose content does not match its name
(truncated, or written by something else) is deleted and compiled again, never run.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import tempfile
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ArtifactStore:
    """A directory of compiled points for one target arch."""

    directory: Path
    arch: str

    def key(self, kernel: KernelDef, problem: Problem, config: Any) -> str:
        """The digest of everything the point's binary depends on."""
        return _digest("\n".join((kernel.name, kernel.source_hash(), problem.static_key(),
                                  config_to_json(config), self.arch, _toolchain())))[:32]

    def find(self, kernel: KernelDef, problem: Problem, config: Any) -> Path | None:
        """The point's artifact if a sound one is stored; an unsound one is deleted."""
        for path in self.directory.glob(f"{self.key(kernel, problem, config)}-*.o"):
            if _digest(path.read_bytes())[:16] == path.stem.rsplit("-", 1)[1]:
                return path
            path.unlink(missing_ok=True)
        return None

    def compile(self, kernel: KernelDef, problem: Problem, config: Any) -> Path:
        """Compile the point in this process for `arch` and store its artifact. The arch is
        passed to the compiler: CuTeDSL reads CUTE_DSL_ARCH once, when it is imported, and
        otherwise asks the driver, which in a process that sees no GPU answers its default
        (sm_100)."""
        key = self.key(kernel, problem, config)
        function = kernel.compile_function(problem, config, f"--gpu-arch {self.arch}")
        self.directory.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(suffix=".o", dir=self.directory)
        os.close(descriptor)
        try:
            function.export_to_c(temporary, function_name=_function_name(key),
                                 export_only_tvm_ffi_symbols=True)
            final = self.directory / f"{key}-{_digest(Path(temporary).read_bytes())[:16]}.o"
            os.replace(temporary, final)
        finally:
            Path(temporary).unlink(missing_ok=True)
        return final

    def load(self, kernel: KernelDef, problem: Problem, config: Any) -> Any | None:
        """The point's stored artifact loaded into this process, bound as `launch` takes it;
        None where no sound artifact is stored."""
        path = self.find(kernel, problem, config)
        if path is None:
            return None
        import cutlass.cute as cute

        module = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
        function = getattr(module, _function_name(path.stem.rsplit("-", 1)[0]))
        return kernel.bound(problem, config, function)


def _function_name(key: str) -> str:
    # One symbol per artifact: a process that loads several points must not see two functions
    # of one name.
    return f"cutetune_{key}"

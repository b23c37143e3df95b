"""The ops' fast path: one route per kernel, in C++ (fast_path.cc), that takes an op's call from
its arguments straight to the compiled kernel the dispatcher serves for it.

The function that serves an op (cutetune.ops.serve) calls its route first (`route.call(
*arguments)`, the arguments its FastCall names, cutetune/fast_call.py). The route reads the
call's key from the arguments TVM-FFI has already converted, finds the row of kernels remembered
under it, picks the token bucket and launches; it returns False, having launched nothing, where
the op's checked path must take the call: a key not remembered, no tokens, more than the largest
bucket, a bucket served by the default (which the dispatcher counts), or a check the kernel does
not make failing. A call the kernel refuses raises its error (TypeError or ValueError) before it
launches, and the op then takes the checked path, whose error names the fault. The checked path
gives the route (`remember`) the row the dispatcher served, under the call's key. TVM-FFI sets
the call's stream to torch's current stream for the route's call, and the kernel, called from
within it, launches on that stream.

The C++ is compiled once per machine into the settings' cache dir (a few seconds; `warmup` does
it, so that an engine's first call does not wait), with $CXX (else c++). Where it cannot be,
a warning says why once, and every call takes the checked path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutetune.build.publish import find_published, publish
from cutetune.fast_call import Constant, DType, FastCall, Value
from cutetune.kernels.registry import KernelDef

log = logging.getLogger("cutetune.fast_path")

SOURCE = Path(__file__).with_name("fast_path.cc")
FAST_PATH_DIR = "fast-path"
# The reading kinds, as fast_path.cc numbers them, and the words its keys hold at most (the
# device one, a value two: its type and its bits).
_DTYPE, _DIM, _VALUE = 0, 1, 2
_KEY_WORDS = 40


def _not_served(*arguments: Any) -> bool:
    return False


class Route:
    """One kernel's fast path, for calls of its op as `fast_call` declares them.
    `call(*arguments)`: True where it launched the kernel (until the first `remember`,
    never)."""

    def __init__(self, kernel: KernelDef, fast_call: FastCall):
        fast_call.check_fields(kernel.problem_type)
        words = 1 + 2 * len(fast_call.keyed) + sum(
            2 if isinstance(r, Value) else 0 if isinstance(r, Constant) else 1
            for r in fast_call.fields.values())
        if words > _KEY_WORDS:
            raise ValueError(f"the fast call of {kernel.name} reads a key of {words} words; "
                             f"fast_path.cc holds {_KEY_WORDS}")
        self.kernel = kernel
        self.fast_call = fast_call
        self.call = _not_served
        self._remember = self._forget = None

    def _make(self) -> bool:
        library = _library()
        if library is None:
            return False
        fast = self.fast_call
        index = {name: i for i, name in enumerate(fast.arguments)}
        readings = []
        for reading in fast.fields.values():
            if isinstance(reading, Constant):
                continue
            kind = (_DTYPE if isinstance(reading, DType) else
                    _VALUE if isinstance(reading, Value) else _DIM)
            readings += [kind, index[reading.argument], getattr(reading, "dim", 0)]
        readings += [r for name in fast.keyed for r in (_VALUE, index[name], 0)]
        nonempty = [n for d in fast.nonempty for n in (index[d.argument], d.dim)]
        rows = fast.rows_per_token
        self.call, self._remember, self._forget = library.make_route(
            len(fast.arguments), fast.launched, index[fast.tokens.argument], fast.tokens.dim,
            readings, [index[name] for name in fast.disjoint_rows], nonempty,
            -1 if rows is None else index[rows.argument])
        return True

    def remember(self, arguments: Sequence[Any], row: Sequence[Any | None], problem: Any,
                 device: int) -> None:
        """Serve later calls with the key of `arguments` (a checked call's, on CUDA device
        `device`) from `row`: the compiled kernel of each bucket of `problem`'s static
        problem, None where the checked path must take the call."""
        if self._remember is None and not self._make():
            return
        kernels = [self._function(compiled, device) for compiled in row]
        rows = self.fast_call.rows_per_token
        per_token, extra = (0, 0) if rows is None else rows.of(problem)
        try:
            self._remember(*arguments, kernels, per_token, extra)
        except (TypeError, ValueError):  # a scalar TVM-FFI does not take: such calls stay
            pass                         # on the checked path

    def _function(self, compiled: Any, device: int) -> Any:
        """What the route calls for `compiled` on `device` (None: the checked path does)."""
        import tvm_ffi

        if compiled is None:
            return None
        if self.fast_call.launch_function is not None:
            compiled = self.fast_call.launch_function(compiled, device)
        if compiled is None or isinstance(compiled, tvm_ffi.Function):
            return compiled
        # A kernel compiled in this process may wrap its function (CuTeDSL's, where its
        # signature has defaults), and gives it by TVM-FFI's protocol; anything else goes
        # down the checked path.
        function = getattr(compiled, "__tvm_ffi_object__", lambda: None)()
        return function if isinstance(function, tvm_ffi.Function) else None

    def forget(self) -> None:
        if self._forget is not None:
            self._forget()


_ROUTES: dict[str, Route] = {}


def route(kernel: KernelDef, fast_call: FastCall) -> Route:
    """The route of `kernel`'s op (made by the op's module, once)."""
    if kernel.name in _ROUTES:
        raise ValueError(f"kernel {kernel.name} has a route already")
    _ROUTES[kernel.name] = Route(kernel, fast_call)
    return _ROUTES[kernel.name]


def forget_all() -> None:
    """Forget every remembered row (a new dispatcher serves other kernels)."""
    for known in _ROUTES.values():
        known.forget()


_built: list[Any] = []  # the loaded library, or None where it cannot be built, once known


def _library():
    """The fast path's library, built into the cache dir where not already there; None, after
    one warning, where it cannot be built."""
    if not _built:
        try:
            _built.append(_load_or_build())
        except FastPathUnavailable as err:
            log.warning("cutetune: the ops' fast path cannot be built (%s); every op call "
                        "takes the checked path, several microseconds more host time", err)
            _built.append(None)
    return _built[0]


def load_library() -> bool:
    """Build (or load) the fast path's library now; False where it cannot be."""
    return _library() is not None


def do_nothing():
    """A TVM-FFI function in C++ that takes any arguments and does nothing: a kernel's
    stand-in, to time a route's own cost with (the library must build)."""
    library = _library()
    if library is None:
        raise FastPathUnavailable("the fast path's library does not build here")
    return library.do_nothing


class FastPathUnavailable(RuntimeError):
    """The fast path's library cannot be built or loaded here; the message says why."""


@dataclass(frozen=True)
class _Build:
    compiler: str
    includes: tuple[str, ...]
    library_dir: Path
    # The library's name in the cache dir, before its content's digest: a file whose content
    # does not match the digest in its name (truncated, say) is never loaded (the dynamic
    # loader can crash the process on one), but removed and built again.
    stem: Path


def _build_plan() -> _Build:
    from tvm_ffi import __version__ as tvm_ffi_version
    from tvm_ffi import libinfo

    from cutetune.settings import load_settings

    compiler = shutil.which(os.environ.get("CXX") or "c++")
    if compiler is None:
        raise FastPathUnavailable("no C++ compiler: install g++ or set CXX")
    library_dir = Path(libinfo.find_libtvm_ffi()).parent
    digest = hashlib.sha256(b"\0".join([
        SOURCE.read_bytes(), tvm_ffi_version.encode(), platform.machine().encode(),
        platform.system().encode(), compiler.encode(), str(library_dir).encode()])).hexdigest()
    stem = load_settings().cache_dir / FAST_PATH_DIR / f"fast_path-{digest[:20]}"
    return _Build(compiler, (libinfo.find_include_path(), libinfo.find_dlpack_include_path()),
                  library_dir, stem)


def _load_or_build():
    import tvm_ffi

    plan = _build_plan()
    library, damaged = find_published(plan.stem)
    for path in damaged:
        log.warning("cutetune: %s is damaged; building the fast path again", path)
    if library is None:
        try:
            plan.stem.parent.mkdir(parents=True, exist_ok=True)
            library = _build(plan, plan.stem.parent)
        except OSError as err:
            log.warning("cutetune: %s cannot be written (%s); building the fast path in a "
                        "temporary directory", plan.stem.parent, err.strerror or err)
            library = _build(plan, Path(tempfile.mkdtemp(prefix="cutetune-fast-path-")))
    try:
        return tvm_ffi.load_module(str(library))
    except (OSError, RuntimeError) as err:  # built for another machine, say
        library.unlink(missing_ok=True)
        raise FastPathUnavailable(f"{library} does not load: {err}") from err


def _build(plan: _Build, directory: Path) -> Path:
    """Compile the library and publish it in `directory` under its name there."""

    def compile_to(library: Path) -> None:
        arguments = [plan.compiler, "-std=c++17", "-O2", "-fPIC", "-shared", "-o", str(library),
                     str(SOURCE), *(f"-I{path}" for path in plan.includes),
                     f"-L{plan.library_dir}", f"-Wl,-rpath,{plan.library_dir}", "-ltvm_ffi"]
        done = subprocess.run(arguments, capture_output=True, text=True)
        if done.returncode:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise FastPathUnavailable(f"{plan.compiler} failed: "
                                      f"{said[-1] if said else done.returncode}")

    return publish(directory / plan.stem.name, compile_to)

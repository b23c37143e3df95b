"""What a kernel declares, and the registry the framework reads it from.

Adding a kernel means writing one module that builds a KernelDef and calls `register`, and the
device module (its CuTeDSL code) that the KernelDef's DeviceCompile names; the tuner, the
dispatcher and every CLI verb work from the KernelDef alone.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutetune.kernels.code_hash import code_closure_hash
from cutetune.spaces.models import ModelShape
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import Alternatives, Space

# Tensors by name; what `make_inputs` returns and what `launch` and `reference` take.
Tensors = Mapping[str, Any]


class UnknownKernelError(LookupError):
    def __str__(self) -> str:  # LookupError would quote the message
        return str(self.args[0])


class NotApplicableError(ValueError):
    """The kernel has nothing to do for this model (e.g. QK-norm on a model without it)."""


class VerificationError(Exception):
    """The kernel's output does not match the reference; the message says where and by how much."""


def compare(name: str, actual: Any, expected: Any, rtol: float, atol: float) -> None:
    """Raise VerificationError unless every element of `actual` (a tensor) is within
    atol + rtol |expected| of `expected` (fp32), naming the first that is not."""
    if tuple(actual.shape) != tuple(expected.shape):
        raise VerificationError(f"{name}: shape {tuple(actual.shape)}, expected "
                                f"{tuple(expected.shape)}")
    actual = actual.float()
    error = (actual - expected).abs()
    bad = ~(error <= atol + rtol * expected.abs())  # NaN compares false, so it counts as bad
    count = int(bad.sum())
    if count:
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise VerificationError(
            f"{name}: {count} of {actual.numel()} elements off (rtol {rtol:g}, atol {atol:g}); "
            f"first at {first}: got {actual[first].item():.6g}, "
            f"expected {expected[first].item():.6g}")


class PeerUnavailable(Exception):
    """A peer cannot run this problem: its library is missing or computes different math."""


@dataclass(frozen=True)
class Peer:
    """An implementation users would otherwise run, put beside ours by `cutetune bench`.

    build: problem -> callable(tensors) returning the kernel's outputs by name; raises
           PeerUnavailable with the reason when it cannot serve the problem. Library imports
           belong inside `build`, so a machine without the library still lists the kernel.
    """

    name: str
    build: Callable[[Problem], Callable[[Tensors], Mapping[str, Any]]]


@dataclass(frozen=True)
class ChainStep:
    """One launch of the unfused chain a fused kernel replaces, which `cutetune bench` times
    beside it as the plan serves each step (tuned winners where stored).

    kernel:  the step's kernel, by name
    problem: the fused kernel's problem -> the step kernel's; raises NotApplicableError,
             with the reason, for a problem no chain of our kernels computes
    names:   the step kernel's tensor names that differ from the chain's (step's -> chain's;
             two of the step's may name one of the chain's): a step reads the chain's
             tensors, and its outputs become the chain's under these names for the steps
             after it
    rounds:  whether the step rounds to its outputs' dtype values the fused kernel carries
             on in fp32 (qk_norm's normed heads, which qk_norm_rope rotates unrounded): each
             such step widens the tolerance the chain is judged by by one rounding
    """

    kernel: str
    problem: Callable[[Problem], Problem]
    names: Mapping[str, str] = field(default_factory=dict)
    rounds: bool = False


@dataclass(frozen=True)
class DeviceCompile:
    """A kernel's compile_function whose code lives in `module`, the kernel's device code
    (which imports CuTeDSL): imported at the first compile, so that importing the kernel's
    declaration imports none of it; the kernel's code hash covers that module whole."""

    module: str

    def __call__(self, problem: Problem, config: Any, options: str = "") -> Any:
        return importlib.import_module(self.module).compile_kernel(problem, config, options)

    @property
    def source_file(self) -> Path:
        package_dir = Path(__file__).resolve().parents[1]
        return package_dir.joinpath(*self.module.split(".")[1:]).with_suffix(".py")


@dataclass(frozen=True)
class KernelDef:
    """Everything the framework needs to plan, tune, verify, store and serve one kernel.

    name:               registry key, CLI argument, DB key
    problem_type:       the kernel's frozen Problem dataclass
    space:              its Config knobs and named constraints
    problems_for_model: (model, dtype name) -> static problems (num_tokens=1); raises
                        NotApplicableError with the reason when the model has none
    default_config:     the seed heuristic's choice (problem, device spec) -> Config
    cost:               (problem, config, device spec) -> roofline Cost
    compile_function:   (problem, config, options="") -> the TVM-FFI function `cute.compile`
                        returns, for the target set by CUTE_DSL_ARCH (sm_90a on a CPU
                        machine); one compile serves every token count. It is what the
                        artifact store exports and loads back in another process. A
                        DeviceCompile names the module that holds it (imported when called)
    bind:               (problem, config, function) -> the callable `launch` takes, for
                        kernels whose launch path checks more than the function does
                        (moe_dispatch checks its cooperative grid); None: the function
    launch:             (compiled, tensors) -> None, on torch's current stream
    make_inputs:        (problem, device, torch.Generator) -> fresh random tensors
    reference:          (tensors, problem) -> fp32 expected outputs by name, computed
                        before launch (the kernel may work in place)
    outputs:            names of the tensors the kernel writes
    written_in_place:   the subset of `outputs` that are also inputs (cannot be poisoned)
    tolerance:          output dtype name -> (rtol, atol) for
                        |out - expected| <= atol + rtol |expected|
    source_file:        the kernel's module (its declaration)
    peers:              other libraries' implementations for `cutetune bench` (torch eager
                        and torch.compile of the reference are added by the bench itself)
    check:              (outputs, expected, problem) -> None, raising
                        VerificationError, for kernels whose outputs a
                        tolerance comparison cannot judge (e.g. rows in any order within a
                        group); None: every output within `tolerance` of `expected`
    bench_inputs:       (problem, device, torch.Generator) -> tensors in the layout every
                        peer accepts, when that differs from `make_inputs` (which may use
                        views only our kernel takes)
    unfused:            a fused kernel's chain of our own kernels that computes the same,
                        one launch per step, which `cutetune bench` times beside it
    borrows_from:       kernels of the same space whose winners suit this one's problems
                        (one memory pattern), lent to its untuned buckets where none of
                        its own problems lends (device/funnel.py `lent_points`)
    """

    name: str
    description: str
    problem_type: type[Problem]
    space: Space | Alternatives
    problems_for_model: Callable[[ModelShape, str], list[Problem]]
    default_config: Callable[[Problem, Any], Any]
    cost: Callable[[Problem, Any, Any], Any]
    compile_function: Callable[..., Any]
    launch: Callable[[Any, Tensors], None]
    make_inputs: Callable[[Problem, Any, Any], Tensors]
    reference: Callable[[Tensors, Problem], dict[str, Any]]
    outputs: tuple[str, ...]
    written_in_place: tuple[str, ...]
    tolerance: Mapping[str, tuple[float, float]]
    source_file: str
    peers: tuple[Peer, ...] = ()
    bench_inputs: Callable[[Problem, Any, Any], Tensors] | None = None
    check: Callable[[Tensors, Mapping[str, Any], Problem], None] | None = None
    bind: Callable[[Problem, Any, Any], Any] | None = None
    unfused: tuple[ChainStep, ...] = ()
    borrows_from: tuple[str, ...] = ()

    def compile(self, problem: Problem, config: Any, options: str = "") -> Any:
        """Compile one point in this process: the callable `launch` takes."""
        return self.bound(problem, config, self.compile_function(problem, config, options))

    def bound(self, problem: Problem, config: Any, function: Any) -> Any:
        """A compiled or loaded function made into the callable `launch` takes."""
        return function if self.bind is None else self.bind(problem, config, function)

    @property
    def device_files(self) -> tuple[Path, ...]:
        """The modules whose code the source hash covers whole: the device module its
        DeviceCompile names, else the declaration, where its compile_function lives."""
        device = getattr(self.compile_function, "source_file", None)
        return (device,) if device else (Path(self.source_file),)

    @property
    def schema_definitions(self) -> tuple[tuple[Path, str], ...]:
        """The types the source hash covers besides the device code, each as (its module's
        file, its name): the Problem type, which the compile reads, and the Config type of
        each form, which fixes how a stored config reads back."""
        space = self.space
        forms = space.forms if isinstance(space, Alternatives) else (space,)
        return tuple((Path(sys.modules[kind.__module__].__file__), kind.__qualname__)
                     for kind in (self.problem_type, *(form.config_type for form in forms)))

    @functools.cached_property
    def _source_hash(self) -> str:
        return code_closure_hash(*self.device_files, definitions=self.schema_definitions)

    def source_hash(self) -> str:
        """Hash of the code the kernel's binaries are built from: its device code and the
        definitions that code and its Problem and Config types use, not the declaration's
        heuristic, cost, constraints or peers (code_hash.py; comments and docstrings left
        out); computed once per process."""
        return self._source_hash


_REGISTRY: dict[str, KernelDef] = {}

def register(kernel: KernelDef) -> KernelDef:
    if kernel.name in _REGISTRY:
        raise ValueError(f"kernel {kernel.name!r} is registered twice")
    if any(step.rounds for step in kernel.unfused) and kernel.check is not None:
        # Such a chain is judged by the tolerance, widened by its steps' roundings.
        raise ValueError(f"kernel {kernel.name!r} declares its own check and an unfused chain "
                         "that rounds where it does not")
    _REGISTRY[kernel.name] = kernel
    return kernel


def _load_all() -> None:
    """Import every module of this package, so that a new kernel file registers itself; done
    lazily so that commands that need no kernel do not pay for importing CuTeDSL."""
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{__package__}.{module.name}")


def kernel_names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def get_kernel(name: str) -> KernelDef:
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownKernelError(f"unknown kernel {name!r}: known kernels are "
                       f"{', '.join(sorted(_REGISTRY))}") from None

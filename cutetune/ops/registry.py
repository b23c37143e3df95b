"""What an op declares, and the registry the package's public functions, torch.library ops, tests
and benchmarks read it from.

Adding an op means writing one module in this package: its checks, its public functions and an
OpDef, which it registers (`register` makes its route, its custom ops and the function that
serves its calls, cutetune.ops.serve); importing cutetune.ops imports every module here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from cutetune.fast_call import FastCall
from cutetune.fast_path import Route, route
from cutetune.kernels.registry import KernelDef, Tensors
from cutetune.ops.serve import serving
from cutetune.spaces.problem import Problem


@dataclass(frozen=True)
class CustomOp:
    """A torch.library custom op, cutetune::<name>, that torch.compile records for an op (no
    graph break): `function` (its annotations are the schema) runs the eager op, writing the
    arguments `mutates` names; `fake` gives its outputs under tracing (None: it returns
    nothing)."""

    name: str
    function: Callable[..., Any]
    mutates: tuple[str, ...] = ()
    fake: Callable[..., Any] | None = None


@dataclass(frozen=True)
class Checked:
    """What the checked path does with a call its op's checks passed: return `result`, having
    launched the kernel with the route's `arguments` (the first `launched` are the kernel's) for
    the problem of static key `static` and `tokens` tokens on CUDA device `device` (-1: the CPU,
    where the kernel's reference computes instead). No `arguments`: nothing to launch (no
    tokens, say)."""

    result: Any
    arguments: tuple = ()
    static: tuple = ()
    tokens: int = 0
    device: int = -1


@dataclass(frozen=True)
class OpDef:
    """Everything the framework needs to serve one op; its name is its kernel's.

    The op's call is what its public functions pass, positionally, to the function that serves
    it (`register`'s): the route's arguments (fast_call.arguments, in order), None for an output
    the caller did not give; for an op that prepares every call (`prepare` without `output`),
    what `prepare`, `check` and `traced` take.

    kernel:     the kernel that computes it (its reference is the CPU path)
    fast_call:  the route's arguments and what its key reads (cutetune.fast_call)
    check:      (*call, allocated) -> Checked: the op's checks, one clear error for the first
                thing wrong; `allocated`: what `prepare` returned for the call to return (the
                outputs it allocated), None where it did not run
    functions:  the public functions, cutetune.<__name__>
    custom_ops: the torch.library ops torch.compile records
    output:     the argument of the call that the op returns, made by `prepare` where None
    prepare:    (*call) -> (the route's arguments or None, what the op returns), for a call whose
                `output` is None (every call where the op has no `output`); no route arguments:
                the call takes the checked path. Errors it raises on inputs the checks refuse
                (torch's own) send the call there too
    traced:     (*call) -> the op's result under torch.compile, from its custom ops; None: the
                one custom op takes the call (its output made by `prepare`), and the op returns
                `output`
    writes:     problem -> the kernel's arguments it writes (what the CPU path writes the
                reference into, in order); None: the kernel's outputs
    calls:      (a problem's kernel inputs, by KernelDef.make_inputs' names; the problem) -> the
                op's public calls of them, by name: what the tests and the host-time
                benchmarks call
    returned:   (what one of `calls` returned, the problem) -> the kernel's outputs it holds,
                by KernelDef.make_inputs' names, in the kernel's layout: for an op some of
                whose calls allocate their outputs and return them, leaving the tensors they
                were given unwritten (the tests judge the returned ones); None: every call
                writes the tensors it is given
    """

    kernel: KernelDef
    fast_call: FastCall
    check: Callable[..., Checked]
    functions: tuple[Callable[..., Any], ...]
    custom_ops: tuple[CustomOp, ...]
    calls: Callable[[Tensors, Problem], Mapping[str, Callable[[], Any]]]
    output: str | None = None
    prepare: Callable[..., tuple[tuple | None, Any]] | None = None
    traced: Callable[..., Any] | None = None
    writes: Callable[[Problem], tuple[str, ...]] | None = None
    returned: Callable[[Any, Problem], Mapping[str, torch.Tensor]] | None = None

    @property
    def name(self) -> str:
        return self.kernel.name

    def __post_init__(self) -> None:
        if self.output is not None and (self.output not in self.fast_call.arguments
                                        or self.prepare is None):
            raise ValueError(f"op {self.name}: output {self.output!r} must be an argument of "
                             "its fast call, made by its prepare")
        if self.traced is None and len(self.custom_ops) != 1:
            raise ValueError(f"op {self.name}: {len(self.custom_ops)} custom ops need a traced "
                             "call that says which to call")


_OPS: dict[str, OpDef] = {}
_ROUTES: dict[str, Route] = {}


def register(op: OpDef) -> Callable[..., Any]:
    """Register `op`, its route and its custom ops; return the function that serves its calls
    (its public functions call it)."""
    if op.name in _OPS:
        raise ValueError(f"op {op.name!r} is registered twice")
    custom = [_custom_op(c) for c in op.custom_ops]
    served_by = route(op.kernel, op.fast_call)
    _OPS[op.name], _ROUTES[op.name] = op, served_by
    return serving(op, served_by, custom[0] if op.traced is None else None)


def _custom_op(declared: CustomOp):
    registered = torch.library.custom_op(f"cutetune::{declared.name}", declared.function,
                                         mutates_args=declared.mutates)
    registered.register_fake(declared.fake or _returns_nothing)
    return registered


def _returns_nothing(*arguments: Any) -> None:
    return None


def ops() -> tuple[OpDef, ...]:
    """Every op, in the order its module registered it (importing cutetune.ops imports them
    all)."""
    return tuple(_OPS.values())


def get_op(name: str) -> OpDef:
    try:
        return _OPS[name]
    except KeyError:
        raise LookupError(f"unknown op {name!r}: known ops are {', '.join(_OPS)}") from None


def route_of(name: str) -> Route:
    """The fast path's route of op `name`."""
    get_op(name)
    return _ROUTES[name]


def public_functions() -> dict[str, Callable[..., Any]]:
    """Every op's public functions, by name (what `cutetune.<name>` gives)."""
    return {function.__name__: function for op in _OPS.values() for function in op.functions}

"""The one path that serves every op's calls (cutetune.ops.registry declares the ops).

An op's public function passes its call to the function `serving` made for the op when it was
registered; the op's pieces are bound in that function's closure, so a call reads no registry.
Under torch.compile the call is the op's custom op. Otherwise the op's route (cutetune.fast_path)
takes it first: the route launches the kernel the dispatcher serves for the call's key and
bucket, or returns False having launched nothing. Then the checked path: the op's checks, which
raise one clear error for the first thing wrong; on the CPU the kernel's fp32 reference
(cutetune.ops.cpu); on a CUDA device the kernel the dispatcher serves, after the route is told
what it may serve for later calls with the same key.

Which errors mean the route refused a call (it then takes the checked path, whose error names
the fault): those of preparing the call for the route (allocating the outputs the caller did not
give: what torch raises on inputs the checks refuse, `UNPREPARED`), and a TypeError or
ValueError from the route (`REFUSED`): TVM-FFI converting an argument, or the kernel's own
argument checks, which run before it launches; and torch's RuntimeError for a tensor TVM-FFI
cannot pack (a meta tensor), which arises before the route runs (`refused`). Anything else the
route raises may follow a launch: it propagates, and the call is never run again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.compiler import is_compiling

from cutetune.fast_path import Route
from cutetune.ops.cpu import write_reference
from cutetune.serving.warmup import current_dispatcher

if TYPE_CHECKING:
    from cutetune.ops.registry import OpDef

UNPREPARED = (AttributeError, IndexError, RuntimeError, TypeError, ValueError)
REFUSED = (TypeError, ValueError)


def serving(op: OpDef, route: Route,
            custom_op: Callable[..., Any] | None) -> Callable[[tuple], Any]:
    """The function that serves `op`'s calls (each given as one tuple, which costs the host
    less than unpacked arguments) through `route`; under torch.compile through op.traced, else
    `custom_op`.

    It is one of three closures, each of the shape of op that it serves, so that a call tests
    only what its op needs: the fast path is on every decode call, where each test is a few
    percent of its host time."""
    output = None if op.output is None else op.fast_call.arguments.index(op.output)
    traced = op.traced or _traced(custom_op, output, op.prepare)
    checked = _checked_path(op, route)
    if op.prepare is None:
        return _serve_in_place(route, traced, checked)
    if output is None:
        return _serve_prepared(route, traced, checked, op.prepare)
    return _serve_with_output(route, traced, checked, op.prepare, output)


def _serve_in_place(route: Route, traced: Callable[..., Any],
                    checked: Callable[[tuple, Any], Any]) -> Callable[[tuple], None]:
    """An op that writes its inputs in place: its call is the route's arguments."""

    def serve(call: tuple) -> None:
        if is_compiling():
            return traced(*call)
        try:
            if route.call(*call):
                return None
        except Exception as error:
            if not refused(error, call):
                raise
        return checked(call, None)

    return serve


def _serve_with_output(route: Route, traced: Callable[..., Any],
                       checked: Callable[[tuple, Any], Any], prepare: Callable[..., Any],
                       output: int) -> Callable[[tuple], Any]:
    """An op that returns its call's argument `output`: the call is the route's arguments
    where that is given, else `prepare` makes it."""

    def serve(call: tuple) -> Any:
        if is_compiling():
            return traced(*call)
        result = call[output]
        if result is not None:
            arguments, allocated = call, None
        else:
            try:
                arguments, result = prepare(*call)
            except UNPREPARED:
                return checked(call, None)
            allocated = result
        try:
            if route.call(*arguments):
                return result
        except Exception as error:
            if not refused(error, arguments):
                raise
        return checked(call, allocated)

    return serve


def _serve_prepared(route: Route, traced: Callable[..., Any],
                    checked: Callable[[tuple, Any], Any],
                    prepare: Callable[..., Any]) -> Callable[[tuple], Any]:
    """An op whose every call `prepare` makes the route's arguments of (or none: the checked
    path takes it)."""

    def serve(call: tuple) -> Any:
        if is_compiling():
            return traced(*call)
        try:
            arguments, result = prepare(*call)
        except UNPREPARED:
            return checked(call, None)
        try:
            if arguments is not None and route.call(*arguments):
                return result
        except Exception as error:
            if not refused(error, arguments):
                raise
        return checked(call, result)

    return serve


def refused(error: Exception, arguments: tuple) -> bool:
    """Whether the route's `error` means it refused the call before any launch: TVM-FFI
    converting an argument, or the kernel's own argument checks (REFUSED); or torch's
    RuntimeError for a tensor TVM-FFI cannot pack at all (on the meta device, say), which
    arises before the route runs. Read only on the error path."""
    if isinstance(error, REFUSED):
        return True
    return isinstance(error, RuntimeError) and any(
        isinstance(a, torch.Tensor) and a.device.type not in ("cuda", "cpu") for a in arguments)


def _traced(custom_op: Callable[..., Any], output: int | None,
            prepare: Callable[..., Any] | None) -> Callable[..., Any]:
    """The call under torch.compile of an op whose one custom op takes its call."""

    def traced(*call: Any) -> Any:
        if output is None:
            custom_op(*call)
            return None
        if call[output] is None:
            call, _ = prepare(*call)
        custom_op(*call)
        return call[output]

    return traced


def _checked_path(op: OpDef, route: Route) -> Callable[[tuple, Any], Any]:
    kernel, check = op.kernel, op.check
    launched = op.fast_call.launched
    names = op.fast_call.arguments[:launched]
    writes = op.writes or (lambda problem: kernel.outputs)

    def checked(call: tuple, allocated: Any) -> Any:
        done = check(*call, allocated)
        if not done.arguments:
            return done.result
        arguments = done.arguments[:launched]
        if done.device < 0:
            problem = kernel.problem_type.from_static_tuple(done.static, done.tokens)
            write_reference(kernel, problem, dict(zip(names, arguments, strict=True)),
                            writes(problem))
            return done.result
        served = current_dispatcher().serving(kernel, done.static, done.tokens)
        if served.route_row is not None:  # the route serves such calls from now on
            route.remember(done.arguments, served.route_row,
                           kernel.problem_type.from_static_tuple(done.static, done.tokens),
                           done.device)
        served.compiled(*arguments)
        return done.result

    return checked

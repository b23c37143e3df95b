"""Whether an op's call went through its fast-path route (cutetune.fast_path), for the tests of
the routes on the GPU and the benchmark that times them on the host."""

from __future__ import annotations

from collections.abc import Callable

from cutetune.ops.registry import ops, route_of


def routed(call: Callable[[], object]) -> bool:
    """Whether a route launched the kernel in `call` (each op's route's `call` wrapped
    meanwhile: True where it launched)."""
    launched = []
    routes = {route_of(op.name) for op in ops()}
    calls = {route: route.call for route in routes}
    for route, route_call in calls.items():
        route.call = lambda *arguments, c=route_call: (r := c(*arguments),
                                                        launched.append(r))[0]
    try:
        call()
    finally:
        for route, route_call in calls.items():
            route.call = route_call
    return True in launched

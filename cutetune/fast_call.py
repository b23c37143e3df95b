"""What fixes a kernel's static problem in a call of its op: the declaration, beside each op,
that the ops' fast path (cutetune.fast_path) keys its rows by.

An op passes its fast path `arguments`, the compiled kernel's own (in its order) first. Each
static field of the kernel's problem is read from one of them: a tensor's dtype or one of its
dims, or a scalar's value (a field every call of the op has the same value of is a `Constant`).
The readings are a key, not the field's value (silu_and_mul's intermediate width is x's width,
halved), so they are held to this only: two calls whose readings agree have the same static
problem. `check_fields` holds them to naming every static field of the problem once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DType:
    argument: str


@dataclass(frozen=True)
class Dim:
    argument: str
    dim: int


@dataclass(frozen=True)
class Value:
    """A scalar argument (int, float, bool, str, a dtype or None), by type and value."""

    argument: str


@dataclass(frozen=True)
class Constant:
    """A field every call of the op has the same value of (not read)."""

    value: Any


Reading = DType | Dim | Value | Constant


@dataclass(frozen=True)
class RowsPerToken:
    """A tensor argument whose rows must be at least per_token * tokens + extra, both fixed by
    the static problem (`of(problem)` gives them)."""

    argument: str
    of: Callable[[Any], tuple[int, int]]


@dataclass(frozen=True)
class FastCall:
    """`arguments`: what the op passes, in order, of which the first `launched` go to the
    compiled kernel; `tokens`: the dim holding the call's token count; `fields`: each static
    field of the problem and its reading. What the fast path checks before it launches, beyond
    the launcher's own checks: the rows of each of `disjoint_rows` (2-d tensors) do not overlap;
    no dim of `nonempty` is zero; `rows_per_token`, where given, holds. `keyed`: scalar arguments
    (None, int, float, bool, str or a dtype) the key holds beyond the static fields. Every kernel
    it serves is a valid point at its bucket's largest token count, and so at fewer."""

    arguments: tuple[str, ...]
    launched: int
    tokens: Dim
    fields: Mapping[str, Reading]
    disjoint_rows: tuple[str, ...] = ()
    nonempty: tuple[Dim, ...] = ()
    rows_per_token: RowsPerToken | None = None
    keyed: tuple[str, ...] = ()
    # (compiled, CUDA device) -> the TVM-FFI function the fast path may call there, or None,
    # for kernels whose launch checks more than their function does (KernelDef.bind); None:
    # the compiled kernel is that function.
    launch_function: Callable[[Any, int], Any] | None = None

    def __post_init__(self) -> None:
        if not 0 < self.launched <= len(self.arguments):
            raise ValueError(f"launched {self.launched} must be 1..{len(self.arguments)}")
        named = [r.argument for r in self.fields.values() if not isinstance(r, Constant)]
        named += [self.tokens.argument, *self.disjoint_rows,
                  *(d.argument for d in self.nonempty), *self.keyed]
        if self.rows_per_token is not None:
            named.append(self.rows_per_token.argument)
        unknown = sorted(set(named) - set(self.arguments))
        if unknown:
            raise ValueError(f"readings name {unknown}, which are not among the arguments "
                             f"{self.arguments}")

    def check_fields(self, problem_type: type) -> None:
        """Raise unless the readings name exactly the static fields of `problem_type`."""
        static_names = problem_type.static_names()
        if set(self.fields) != set(static_names):
            missing = sorted(set(static_names) - set(self.fields))
            extra = sorted(set(self.fields) - set(static_names))
            raise ValueError(f"the fast call of {problem_type.__name__} must read each static "
                             f"field once: missing {missing}, not fields {extra}")

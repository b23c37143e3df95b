"""Configuration spaces: named knobs, named constraints, and the enumeration of valid points.

A kernel's space is the product of its Params, filtered by its Constraints. Enumerating a space
for a Problem keeps every rejected point together with the name of the first constraint that
rejected it, so a user can see why a point is not available.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from cutetune.spaces.problem import Problem

ConfigT = TypeVar("ConfigT")


@dataclass(frozen=True)
class Param:
    """One knob the tuner may turn: a name (a field of the kernel's Config) and its choices."""

    name: str
    choices: tuple[Any, ...]
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError(f"param {self.name!r} declares no choices")
        if len(set(self.choices)) != len(self.choices):
            raise ValueError(f"param {self.name!r} repeats a choice: {self.choices}")


@dataclass(frozen=True)
class Constraint:
    """A named predicate over (problem, config, device); `reason` says what it demands."""

    name: str
    reason: str
    holds: Callable[[Any, Any, Any], bool]


@dataclass(frozen=True)
class Rejection(Generic[ConfigT]):
    config: ConfigT
    constraint: str
    reason: str


@dataclass(frozen=True)
class Enumeration(Generic[ConfigT]):
    """The outcome of enumerating a space for one problem on one device."""

    valid: tuple[ConfigT, ...]
    rejected: tuple[Rejection[ConfigT], ...]

    @property
    def declared(self) -> int:
        return len(self.valid) + len(self.rejected)

    def rejections_by_constraint(self) -> dict[str, int]:
        return dict(Counter(r.constraint for r in self.rejected))

    def raise_if_empty(self, what: str) -> None:
        """EmptySpaceError naming which constraints removed how many points of `what`."""
        if not self.valid:
            removed = ", ".join(f"{name} removed {count}" for name, count in
                                self.rejections_by_constraint().items())
            raise EmptySpaceError(f"no valid point for {what}: {removed}")


class EmptySpaceError(ValueError):
    """Raised when no point survives; the message names what removed the points."""


@dataclass(frozen=True)
class Space(Generic[ConfigT]):
    """The product of `params` filtered by `constraints`, yielding `config_type` instances."""

    config_type: type[ConfigT]
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...]

    def __post_init__(self) -> None:
        fields = {f.name for f in dataclasses.fields(self.config_type)}
        names = [p.name for p in self.params]
        if set(names) != fields or len(names) != len(fields):
            raise TypeError(
                f"params {sorted(names)} must be exactly the fields of "
                f"{self.config_type.__name__} {sorted(fields)}"
            )

    def declared_points(self) -> list[ConfigT]:
        names = [p.name for p in self.params]
        return [
            self.config_type(**dict(zip(names, values, strict=True)))
            for values in itertools.product(*(p.choices for p in self.params))
        ]

    def first_violation(self, problem: Problem, config: ConfigT, device: Any) -> Constraint | None:
        for constraint in self.constraints:
            if not constraint.holds(problem, config, device):
                return constraint
        return None

    def enumerate(self, problem: Problem, device: Any) -> Enumeration[ConfigT]:
        valid: list[ConfigT] = []
        rejected: list[Rejection[ConfigT]] = []
        for config in self.declared_points():
            violated = self.first_violation(problem, config, device)
            if violated is None:
                valid.append(config)
            else:
                rejected.append(Rejection(config, violated.name, violated.reason))
        return Enumeration(tuple(valid), tuple(rejected))

    def check(self, problem: Problem, config: ConfigT, device: Any) -> None:
        """Raise ValueError naming the constraint if `config` is not a valid point."""
        for param in self.params:
            if getattr(config, param.name) not in param.choices:
                raise ValueError(
                    f"{param.name}={getattr(config, param.name)!r} is not one of {param.choices}"
                )
        violated = self.first_violation(problem, config, device)
        if violated is not None:
            raise ValueError(f"config {config_to_json(config)} violates {violated.name}: "
                             f"{violated.reason}")

    def valid_points(self, problem: Problem, device: Any) -> tuple[ConfigT, ...]:
        """The valid points, or EmptySpaceError saying which constraints removed how many."""
        enumeration = self.enumerate(problem, device)
        enumeration.raise_if_empty(problem.describe())
        return enumeration.valid

    def config_from_dict(self, values: dict[str, Any]) -> ConfigT:
        return self.config_type(**values)


def config_to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_to_json(config: Any) -> str:
    """Canonical JSON of a config: the key stored in the DB and used by the compile cache."""
    return json.dumps(config_to_dict(config), sort_keys=True)

"""Configuration spaces: named knobs, named constraints, and the enumeration of valid points.

A kernel's space is the product of its Params, filtered by its Constraints. Enumerating a space
for a Problem keeps every rejected point together with the name of the first constraint that
rejected it, so a user can see why a point is not available.

A kernel with several algorithms declares Alternatives: one Space per form (FlashInfer's
runners), each of its own Config type with only its own knobs and constraints, plus the
constraints every form shares. A form's Config names its form in a class attribute `form`,
which its dict and JSON carry, so a stored point reads back as the form it was.
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


class _Enumerable:
    """What Space and Alternatives derive from their declared points and first_violation."""

    def enumerate(self, problem: Problem, device: Any) -> Enumeration:
        valid, rejected = [], []
        for config in self.declared_points():
            violated = self.first_violation(problem, config, device)
            if violated is None:
                valid.append(config)
            else:
                rejected.append(Rejection(config, violated.name, violated.reason))
        return Enumeration(tuple(valid), tuple(rejected))

    def valid_points(self, problem: Problem, device: Any) -> tuple:
        """The valid points, or EmptySpaceError saying which constraints removed how many."""
        enumeration = self.enumerate(problem, device)
        enumeration.raise_if_empty(problem.describe())
        return enumeration.valid


@dataclass(frozen=True)
class Space(_Enumerable, Generic[ConfigT]):
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

    def check(self, problem: Problem, config: ConfigT, device: Any) -> None:
        """Raise ValueError naming the constraint if `config` is not a valid point."""
        for param in self.params:
            if not _is_choice(getattr(config, param.name), param.choices):
                raise ValueError(
                    f"{param.name}={getattr(config, param.name)!r} is not one of {param.choices}"
                )
        violated = self.first_violation(problem, config, device)
        if violated is not None:
            raise ValueError(f"config {config_to_json(config)} violates {violated.name}: "
                             f"{violated.reason}")

    def config_from_dict(self, values: dict[str, Any]) -> ConfigT:
        """A point from its knobs by name (config_to_dict's; a knob the config type gives a
        default may be left out); ValueError names each knob that is unknown or missing, as a
        stored config of an older space may have."""
        names = [p.name for p in self.params]
        unknown = [name for name in values if name not in names]
        missing = [f.name for f in dataclasses.fields(self.config_type)
                   if f.name not in values and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if unknown or missing:
            raise ValueError("; ".join([f"unknown knob {name!r}" for name in unknown]
                                       + [f"missing knob {name!r}" for name in missing])
                             + f" (the knobs are {', '.join(names)})")
        return self.config_type(**values)

    def sample(self, choose: Callable[[str, tuple[Any, ...]], Any]) -> ConfigT:
        """The point whose knobs `choose(name, choices)` picks (an Optuna trial's
        suggest_categorical, say), knob by knob."""
        return self.config_type(**{p.name: choose(p.name, p.choices) for p in self.params})

    def sampled_values(self, config: ConfigT) -> dict[str, Any]:
        """What `sample` chooses to build `config`, by name: the inverse of `sample`."""
        return dataclasses.asdict(config)

    def config_from_sampled(self, values: dict[str, Any]) -> ConfigT:
        return self.config_type(**values)


FORM_KEY = "form"


@dataclass(frozen=True)
class Alternatives(_Enumerable):
    """The union of several forms of one kernel, each a Space of its own Config type (whose
    class attribute `form` names it), plus the constraints every form shares (checked first).
    Sampling chooses the form, then that form's knobs, under names `form.knob`, so that a
    knob of one form never takes another form's choices."""

    forms: tuple[Space, ...]
    constraints: tuple[Constraint, ...] = ()

    def __post_init__(self) -> None:
        names = [form.config_type.form for form in self.forms]
        if len(set(names)) != len(names):
            raise ValueError(f"forms {names} repeat a name")

    def _form(self, name: str) -> Space:
        for form in self.forms:
            if form.config_type.form == name:
                return form
        raise ValueError(f"unknown form {name!r}: the forms are "
                         f"{', '.join(f.config_type.form for f in self.forms)}")

    def _form_of(self, config: Any) -> Space:
        form = self._form(getattr(config, FORM_KEY, None))
        if type(config) is not form.config_type:
            raise TypeError(f"{config!r} is not a point of any form")
        return form

    def declared_points(self) -> list[Any]:
        return [config for form in self.forms for config in form.declared_points()]

    def first_violation(self, problem: Problem, config: Any, device: Any) -> Constraint | None:
        for constraint in self.constraints:
            if not constraint.holds(problem, config, device):
                return constraint
        return self._form_of(config).first_violation(problem, config, device)

    def check(self, problem: Problem, config: Any, device: Any) -> None:
        form = self._form_of(config)
        for param in form.params:
            if not _is_choice(getattr(config, param.name), param.choices):
                raise ValueError(f"{config.form} {param.name}={getattr(config, param.name)!r} "
                                 f"is not one of {param.choices}")
        violated = self.first_violation(problem, config, device)
        if violated is not None:
            raise ValueError(f"config {config_to_json(config)} violates {violated.name}: "
                             f"{violated.reason}")

    def config_from_dict(self, values: dict[str, Any]) -> Any:
        """A point from its dict (config_to_dict's): the form named under FORM_KEY."""
        knobs = dict(values)
        if FORM_KEY not in knobs:
            raise ValueError(f"missing knob {FORM_KEY!r} (the forms are "
                             f"{', '.join(f.config_type.form for f in self.forms)})")
        return self._form(knobs.pop(FORM_KEY)).config_from_dict(knobs)

    def sample(self, choose: Callable[[str, tuple[Any, ...]], Any]) -> Any:
        form = self._form(choose(FORM_KEY, tuple(f.config_type.form for f in self.forms)))
        name = form.config_type.form
        return form.sample(lambda knob, choices: choose(f"{name}.{knob}", choices))

    def sampled_values(self, config: Any) -> dict[str, Any]:
        form = self._form_of(config).config_type.form
        return {FORM_KEY: form, **{f"{form}.{knob}": value
                                    for knob, value in dataclasses.asdict(config).items()}}

    def config_from_sampled(self, values: dict[str, Any]) -> Any:
        form = values[FORM_KEY]
        prefix = f"{form}."
        return self._form(form).config_from_dict(
            {name.removeprefix(prefix): value for name, value in values.items()
             if name.startswith(prefix)})


def _is_choice(value: Any, choices: tuple[Any, ...]) -> bool:
    """`value` is one of `choices` and of its type: 128.0 or True equal 128 and 1 but are
    written differently in the config's JSON, the key of the compile cache and of the DB."""
    return any(value == choice and type(value) is type(choice) for choice in choices)


def config_to_dict(config: Any) -> dict[str, Any]:
    """The point's knobs by name; a point of one of several forms names its form first."""
    knobs = dataclasses.asdict(config)
    if FORM_KEY in knobs:  # a knob of that name (one form among its kernel's choices)
        return knobs
    form = getattr(type(config), FORM_KEY, None)
    return knobs if form is None else {FORM_KEY: form, **knobs}


def config_to_json(config: Any) -> str:
    """Canonical JSON of a config: the key stored in the DB and used by the compile cache."""
    return json.dumps(config_to_dict(config), sort_keys=True)

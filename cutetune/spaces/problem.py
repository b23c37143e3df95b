"""The part of a kernel call that the caller fixes.

Every kernel's Problem is a frozen dataclass deriving from `Problem`: `num_tokens` is the dynamic
part (served by one compiled kernel, tuned per bucket); every other field is static and
specialises the compile.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TOKENS_FIELD = "num_tokens"


@functools.cache
def _static_names(problem_type: type) -> tuple[str, ...]:
    """The static fields of a Problem type, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(problem_type) if f.name != TOKENS_FIELD)


@functools.cache
def _static_getter(problem_type: type) -> tuple[tuple[str, ...], Callable[[dict], tuple]]:
    """The static field names and a function that picks them, as a tuple, from a dict."""
    names = _static_names(problem_type)
    pick = operator.itemgetter(*names)
    return names, pick if len(names) > 1 else (lambda static: (pick(static),))


@functools.cache
def _static_types(problem_type: type) -> dict[str, type]:
    """The declared class of each static field whose annotation is a plain class."""
    hints = typing.get_type_hints(problem_type)
    return {name: hints[name] for name in _static_names(problem_type)
            if isinstance(hints.get(name), type)}


@dataclass(frozen=True, kw_only=True)
class Problem:
    num_tokens: int

    def __post_init__(self) -> None:
        if (not isinstance(self.num_tokens, int) or isinstance(self.num_tokens, bool)
                or self.num_tokens < 1):
            raise ValueError(f"num_tokens must be a positive integer, got {self.num_tokens!r}")

    def static_fields(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self)
        del fields[TOKENS_FIELD]
        return fields

    @classmethod
    def static_names(cls) -> tuple[str, ...]:
        """The static fields, in declaration order."""
        return _static_names(cls)

    def static_key(self) -> str:
        """Canonical JSON of the static part: the compile specialisation and the DB key."""
        return json.dumps(self.static_fields(), sort_keys=True)

    def static_tuple(self) -> tuple:
        """The static fields in declaration order: the dispatcher's hot-path key."""
        return tuple(getattr(self, name) for name in _static_names(type(self)))

    @classmethod
    def static_tuple_of(cls, **static: Any) -> tuple:
        """The hot-path key of the problem these static fields (every one, by name) describe,
        as `static_tuple` gives it, without building the problem: what a public op computes
        on every call (so it picks the fields with one prebuilt getter, not a loop)."""
        names, pick = _static_getter(cls)
        if len(static) == len(names):
            try:
                return pick(static)
            except KeyError:  # a name that is no static field
                pass
        raise TypeError(f"{cls.__name__}'s static fields are {', '.join(names)}; got "
                        f"{', '.join(static)}")

    @classmethod
    def from_static_tuple(cls, static: tuple, num_tokens: int) -> Problem:
        """The problem of a hot-path key (`static_tuple`) at `num_tokens` tokens."""
        return cls(num_tokens=num_tokens, **dict(zip(_static_names(cls), static, strict=True)))

    @classmethod
    def from_static_key(cls, static_key: str, num_tokens: int) -> Problem:
        """The problem whose `static_key` this is, at `num_tokens` tokens, checked by the
        type's own validation: what a stored or imported key is read back through. ValueError
        says what is wrong: not a JSON object, a field unknown, missing or of another type than
        declared, or a value the type refuses."""
        try:
            static = json.loads(static_key)
        except (TypeError, ValueError):
            raise ValueError(f"{static_key!r} is not JSON") from None
        if not isinstance(static, dict):
            raise ValueError(f"{static_key!r} is not a JSON object")
        names = _static_names(cls)
        unknown = [name for name in static if name not in names]
        required = [f.name for f in dataclasses.fields(cls) if f.name in names
                    and f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]
        missing = [name for name in required if name not in static]
        if unknown or missing:
            raise ValueError("; ".join(
                [f"unknown field {name!r}" for name in unknown]
                + [f"missing field {name!r}" for name in missing])
                + f" ({cls.__name__}'s static fields are {', '.join(names)})")
        values = {}
        for name, value in static.items():
            declared = _static_types(cls).get(name)
            # JSON written by hand may give 1 for 1.0; the key is then written as it would be
            # for the problem itself, so it matches the one tuning stores.
            if declared is float and type(value) is int:
                value = float(value)
            if declared is not None and type(value) is not declared:
                raise ValueError(f"{name} must be of type {declared.__name__}, got "
                                 f"{value!r}")
            values[name] = value
        return cls(num_tokens=num_tokens, **values)

    def with_tokens(self, num_tokens: int) -> Problem:
        return dataclasses.replace(self, num_tokens=num_tokens)

    def describe(self) -> str:
        static = " ".join(f"{k}={v}" for k, v in self.static_fields().items())
        return f"{type(self).__name__}({static} tokens={self.num_tokens})"

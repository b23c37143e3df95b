"""The part of a kernel call that the caller fixes.

Every kernel's Problem is a frozen dataclass deriving from `Problem`: `num_tokens` is the dynamic
part (served by one compiled kernel, tuned per bucket); every other field is static and
specialises the compile.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

TOKENS_FIELD = "num_tokens"


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

    def static_key(self) -> str:
        """Canonical JSON of the static part: the compile specialisation and the DB key."""
        return json.dumps(self.static_fields(), sort_keys=True)

    def static_tuple(self) -> tuple:
        """The static fields in declaration order: the dispatcher's hot-path key."""
        return tuple(self.static_fields().values())

    def with_tokens(self, num_tokens: int) -> Problem:
        return dataclasses.replace(self, num_tokens=num_tokens)

    def describe(self) -> str:
        static = " ".join(f"{k}={v}" for k, v in self.static_fields().items())
        return f"{type(self).__name__}({static} tokens={self.num_tokens})"

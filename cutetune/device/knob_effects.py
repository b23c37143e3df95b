"""What the calibrated model's terms miss about a kernel's knobs, learned from the stored trials
(knob_fit.py fits them): per kernel and bucket, the factor each knob's value multiplies the
predicted time by (a wider vector, more warps per block: what costs instructions, registers or
a longer reduction, which the terms do not count). A factor reads as "at 8 tokens,
vector_bits=128 takes 0.93x what the terms predict, beside this kernel's other values".

Each kernel with factors has its own prune factor, measured by predicting each of its problems
from the others' factors (knob_fit.py); a kernel without them prunes by the model's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cutetune.spaces.space import config_to_dict

# Where a prediction is made: the kernel's name, the bucket and the config.
KnobPoint = tuple[str, int, Any]


def knob_names(config: Any) -> tuple[str, ...]:
    return tuple(f"{name}={value}" for name, value in config_to_dict(config).items())


@dataclass(frozen=True)
class KnobEffects:
    """`log_factors[kernel][bucket][knob]` and each such kernel's cross-validated
    `prune_factors[kernel]`; a kernel or bucket without them predicts a factor of 1."""

    log_factors: Mapping[str, Mapping[int, Mapping[str, float]]] = field(default_factory=dict)
    prune_factors: Mapping[str, float] = field(default_factory=dict)

    def factor(self, kernel: str, bucket: int, config: Any) -> float:
        by_knob = self.log_factors.get(kernel, {}).get(bucket)
        if not by_knob:
            return 1.0
        return math.exp(sum(by_knob.get(knob, 0.0) for knob in knob_names(config)))

    def describe(self) -> str:
        if not self.prune_factors:
            return "no knob factors (no kernel tuned for two problems)"
        return "knob factors, cross-validated prune: " + ", ".join(
            f"{k} {f:.2f}x" for k, f in sorted(self.prune_factors.items()))

    def to_dict(self) -> dict:
        return {"log_factors": {k: {str(b): dict(v) for b, v in by_bucket.items()}
                                for k, by_bucket in self.log_factors.items()},
                "prune_factors": dict(self.prune_factors)}

    @classmethod
    def from_dict(cls, values: dict) -> KnobEffects:
        return cls({k: {int(b): dict(v) for b, v in by_bucket.items()}
                    for k, by_bucket in values["log_factors"].items()},
                   dict(values["prune_factors"]))

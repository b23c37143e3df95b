"""Stored points read back as points of today's kernels: the one check that an imported row,
and a winner the dispatcher, the report or `cache build` is about to serve or compile, must
pass. A point stored by another cutetune (a kernel since renamed, a knob since removed, a
problem the kernel no longer accepts) or written by hand is refused with the field and the
reason, never half-read into a compile.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cutetune.kernels.registry import KernelDef, UnknownKernelError, get_kernel
from cutetune.spaces.buckets import check_bucket
from cutetune.spaces.problem import Problem


class UnusablePoint(ValueError):
    """A stored point that today's kernels cannot use; `field` is the stored column at fault
    (kernel_name, bucket, static_key or config_json) and `reason` says why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(field, reason)
        self.field = field
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


@dataclass(frozen=True)
class StoredPoint:
    """A stored point read back: its kernel, its problem at its bucket's token count, and its
    config (canonical: `problem.static_key()` and `config_to_json(config)` are what a tuning
    of the same point would store)."""

    kernel: KernelDef
    problem: Problem
    config: Any


def stored_point(kernel: KernelDef | str, static_key: str, bucket: int, config_json: str,
                 device: Any) -> StoredPoint:
    """The point a stored row names, checked as a freshly tuned one is: a registered kernel
    (where given by name), a bucket of the bucketing policy, a static key the kernel's problem
    type accepts, and a config of the kernel's space that is valid for that problem at that
    bucket on `device` (a DeviceSpec, which the space's constraints read). Raises UnusablePoint
    naming the first field at fault."""
    if isinstance(kernel, str):
        try:
            kernel = get_kernel(kernel)
        except UnknownKernelError as err:
            raise UnusablePoint("kernel_name", str(err)) from None
    try:
        check_bucket(bucket)
    except ValueError as err:
        raise UnusablePoint("bucket", str(err)) from None
    try:
        problem = kernel.problem_type.from_static_key(static_key, bucket)
    except (TypeError, ValueError) as err:
        raise UnusablePoint("static_key", str(err)) from None
    try:
        knobs = json.loads(config_json)
        if not isinstance(knobs, dict):
            raise ValueError(f"{config_json!r} is not a JSON object")
        config = kernel.space.config_from_dict(knobs)
        kernel.space.check(problem, config, device)
    except (TypeError, ValueError) as err:  # json's JSONDecodeError is a ValueError
        raise UnusablePoint("config_json", str(err)) from None
    return StoredPoint(kernel, problem, config)

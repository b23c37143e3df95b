"""The input checks many ops share, each raising one clear error that names the argument, what
is wrong with it and what is accepted, before anything launches."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

# The weight_bias values the norms take: 0, or 1 where the model stores w - 1 (Gemma).
WEIGHT_BIASES = (0.0, 1.0)


def device_index(op: str, anchor_name: str, anchor: torch.Tensor,
                 others: Iterable[tuple[str, torch.Tensor | None]]) -> int:
    """`anchor`'s CUDA device index (-1: the CPU), once it is on a CUDA device or the CPU and
    every tensor of `others` ((name, tensor or None) pairs; None: not given) is on its device.
    `op` names what runs there. Devices are compared whole: get_device() is -1 for the CPU and
    for every other device but CUDA's (meta), so it cannot tell a meta tensor from a CPU one."""
    device = anchor.device
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"{anchor_name} is on {device}: {op} runs on a CUDA device or the CPU")
    for name, t in others:
        if t is not None and t.device != device:
            raise ValueError(f"{name} is on {t.device} but {anchor_name} is on {device}")
    return anchor.get_device()


def is_int(value: object) -> bool:
    """Whether `value` is an int, which a bool is not taken for (True is no size)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether `value` is an int or a float, a bool not among them."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_bool(name: str, value: object) -> None:
    # A flag read as truthy would take 'no' or None for True, or 0 for False, silently.
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def check_choice(name: str, value: object, choices: tuple[int, ...]) -> None:
    """`value` one of the int `choices` (128.0 equals 128, but sizes and shapes take ints)."""
    if not is_int(value) or value not in choices:
        raise ValueError(f"{name} must be an int among {choices}, got {value!r}")


def check_int(name: str, value: object, minimum: int = 1) -> None:
    if not is_int(value) or value < minimum:
        wanted = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
        raise ValueError(f"{name} must be {wanted}, got {value!r}")


def check_number(name: str, value: object) -> None:
    # float() would read a string ('8') or a bool as a number.
    if not is_number(value):
        raise TypeError(f"{name} must be a number (an int or a float), got {value!r}")


def check_positive_size(name: str, size: int) -> None:
    """A dimension the kernel divides into vectors or blocks: zero would pass every
    divisibility check and fail in the first one that reads a stride."""
    if size < 1:
        raise ValueError(f"{name} must be positive, got {size}")


def check_norm_scalars(eps: object, weight_bias: object) -> None:
    """The RMSNorm's eps (finite and positive: inf would turn every row into zeros) and
    weight_bias (0 or 1)."""
    if not is_number(eps) or not 0 < eps < math.inf:
        raise ValueError(f"eps must be a finite number above 0, got {eps!r}")
    if not is_number(weight_bias) or weight_bias not in WEIGHT_BIASES:
        raise ValueError(f"weight_bias must be 0 or 1 (Gemma-style), got {weight_bias!r}")

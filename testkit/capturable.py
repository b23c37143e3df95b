"""Whether a torch function's host side is one a CUDA graph can capture, checked on the CPU.

`cutetune bench` times torch eager (a kernel's reference) inside a CUDA graph capture, where a
host-to-device copy of pageable memory and any read of a device value back to the host fail.
`run_on_meta` runs the function on meta copies of its tensors, so that a read back (.item(),
the bool of a tensor, a shape that depends on values such as boolean-mask indexing) raises as
meta tensors have no values, and refuses what meta tensors alone let pass: a tensor built from
Python data (torch.tensor, as_tensor, asarray, new_tensor, which copy host memory to the
device) and any CPU tensor an operation takes or makes (a table built on the CPU, .to(device)
of a CPU tensor)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# The calls that build a tensor from Python data: on the CPU, then copied to their device.
FROM_HOST_DATA = (torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor)


class NotCapturable(AssertionError):
    """Raised where the function does what a CUDA graph capture cannot."""


class _NoTensorFromHostData(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in FROM_HOST_DATA:
            raise NotCapturable(f"{func.__name__} builds a tensor from Python data and copies it "
                                "to the device: build it there (torch.full, arange) or use "
                                "Python scalars")
        return func(*args, **(kwargs or {}))


class _NoCpuTensor(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if any(isinstance(t, torch.Tensor) and t.device.type == "cpu"
               for t in tree_leaves((args, kwargs, result))):
            raise NotCapturable(f"{func} takes or makes a CPU tensor while the inputs are on the "
                                "device: a copy between host and device")
        return result


def run_on_meta(function: Callable[[dict[str, torch.Tensor]], Any],
                tensors: Mapping[str, torch.Tensor]) -> Any:
    """function(meta copies of `tensors`), raising NotCapturable (or meta's own error for a
    read back) where it does what a CUDA graph capture cannot."""
    on_meta = {name: t.to("meta") for name, t in tensors.items()}
    with _NoTensorFromHostData(), _NoCpuTensor():
        return function(on_meta)

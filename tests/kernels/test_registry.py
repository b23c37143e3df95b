"""The kernel registry: kernels register themselves; unknown names are one clear error."""

import pytest

from cutetune.kernels.registry import UnknownKernelError, get_kernel, kernel_names


def test_kernel_modules_register_themselves():
    assert "qk_norm" in kernel_names()
    assert get_kernel("qk_norm").name == "qk_norm"


def test_unknown_kernel_lists_the_known_ones():
    with pytest.raises(UnknownKernelError) as info:
        get_kernel("rms_norm_typo")
    assert str(info.value) == "unknown kernel 'rms_norm_typo': known kernels are " + ", ".join(
        kernel_names())

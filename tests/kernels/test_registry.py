"""The kernel registry: kernels register themselves; unknown names are one clear error."""

from pathlib import Path

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


def test_the_cheap_kernel_list_is_what_the_kernel_modules_register():
    """cutetune --help lists kernels.names.KERNEL_NAMES without importing the kernels; it must
    name exactly the kernels of cutetune's own modules (a test may register others)."""
    import cutetune.kernels
    from cutetune.kernels.names import KERNEL_NAMES

    package = Path(cutetune.kernels.__file__).resolve().parent
    registered = [name for name in kernel_names()
                  if Path(get_kernel(name).source_file).resolve().is_relative_to(package)]
    assert list(KERNEL_NAMES) == registered


def test_a_kernel_borrows_only_from_registered_kernels_of_its_own_space():
    for name in kernel_names():
        kernel = get_kernel(name)
        for other in kernel.borrows_from:
            assert other != name and get_kernel(other).space is kernel.space, (name, other)
    assert get_kernel("gelu_and_mul").borrows_from == ("silu_and_mul",)

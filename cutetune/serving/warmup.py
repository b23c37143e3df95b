"""The process-wide dispatcher the public ops call through, and the warmup that makes it:
this device's winners read, the points the plan names made ready (from the artifact cache,
compiled in parallel where missing), the fast path's library loaded."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from cutetune.build.artifacts import ARTIFACTS_DIR, NO_COMPILER, ArtifactStore, arch_for, c_compiler
from cutetune.fast_path import forget_all, load_library
from cutetune.kernels.code_hash import CODE_HASHES, remember_in
from cutetune.serving.table import Dispatcher
from cutetune.spaces.models import ModelShape, load_model

log = logging.getLogger("cutetune.serving")


_current: Dispatcher | None = None


def current_dispatcher() -> Dispatcher:
    """The dispatcher set by `warmup`; before any warmup, one that serves defaults (and, where
    no GPU is visible, one that serves nothing and says so)."""
    if _current is None:
        set_current(Dispatcher(_current_device_spec()))
    return _current


def set_current(dispatcher: Dispatcher | None) -> None:
    """Make `dispatcher` the one the ops call through (None: a default one at the next call);
    the ops' fast path forgets what the previous one served."""
    global _current
    forget_all()
    _current = dispatcher


_unwritable_warned: set[str] = set()


def artifact_store(cache_dir, fingerprint) -> ArtifactStore | None:
    """The artifact cache for this GPU's arch under `cache_dir`; None, after one warning per
    directory, where it cannot be written or no C compiler links its artifacts (the points
    are then compiled in memory)."""
    store = ArtifactStore(cache_dir / ARTIFACTS_DIR, arch_for(fingerprint.compute_capability))
    if not store.writable():
        why = f"the artifact cache {store.directory} cannot be written"
    elif c_compiler() is None:
        why = NO_COMPILER
    else:
        return store
    if str(store.directory) not in _unwritable_warned:
        _unwritable_warned.add(str(store.directory))
        log.warning("cutetune: %s; compiling in memory", why)
    return None


def _current_device_spec():
    """The spec of the GPU in use; None where no GPU is visible."""
    import torch

    from cutetune.device.specs import device_spec_for

    if not torch.cuda.is_available():
        return None
    return device_spec_for(torch.cuda.get_device_name())


def warmup(model: str | ModelShape, dtype: str = "bfloat16",
           kernels: Sequence[str] | None = None, db_url: str | None = None) -> Dispatcher:
    """Load this device's winners for every kernel `model` uses (and, for the buckets none
    covers, a winner borrowed from another problem of the kernel, else the calibrated cost
    model's best point where `cutetune calibrate` fitted one for this device), compile them,
    and make the result the dispatcher that `cutetune.qk_norm` and the other ops call
    through. `model` is a preset name, the path of a Hugging Face config.json, or a
    ModelShape (e.g. `cutetune.spaces.models.model_from_hf_config` of a loaded model's
    config)."""
    from cutetune.device.specs import device_spec_for
    from cutetune.kernels.registry import NotApplicableError, get_kernel, kernel_names
    from cutetune.results_db import (
        DeviceFingerprint,
        calibration_to_serve_at,
        shipped_winners,
        winners_to_serve_at,
    )
    from cutetune.settings import load_settings

    shape = model if isinstance(model, ModelShape) else load_model(model)
    fingerprint = DeviceFingerprint.current()
    settings = load_settings()
    store = artifact_store(settings.cache_dir, fingerprint)
    if store is not None:
        remember_in(store.directory / CODE_HASHES)
    url = db_url or settings.db_url
    dispatcher = Dispatcher(device_spec_for(fingerprint.gpu_name),
                            winners_to_serve_at(url, fingerprint), store,
                            compile_processes=os.cpu_count() or 1,
                            shipped=shipped_winners(fingerprint),
                            calibrated=calibration_to_serve_at(url, fingerprint))
    work = []
    for name in kernels or kernel_names():
        kernel = get_kernel(name)
        try:
            work.append((kernel, kernel.problems_for_model(shape, dtype)))
        except NotApplicableError:
            if kernels:  # asked for by name: say why not
                raise
    if not work:
        raise ValueError(f"no kernel of cutetune applies to model {shape.name}")
    dispatcher.warmup_all(work)
    load_library()  # the fast path's, built here where absent: the first call does not wait
    set_current(dispatcher)
    return dispatcher

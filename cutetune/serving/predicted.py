"""The calibrated cost model's pick per bucket for problems nothing tuned covers, worked out once
and remembered in a file beside the artifact cache: enumerating a problem's space and predicting
every point at each bucket costs about 5 ms per problem, over a second for a whole
model, which a warm start (at most 1 s) cannot pay. A pick is keyed by the calibration, the
kernel's source and the static problem, so a new calibration or an edited kernel picks again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from cutetune.atomic_file import write_atomically
from cutetune.device.calibrated import CalibratedModel
from cutetune.device.funnel import predicted_best
from cutetune.kernels.registry import KernelDef
from cutetune.spaces.buckets import BUCKETS
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import config_to_json

log = logging.getLogger("cutetune.serving")
PICKS_FILE = "predicted-picks.json"


class PredictedPicks:
    """`calibrated`'s best point per bucket of BUCKETS for a static problem on `spec`;
    remembered in the file `path` (None: in this process only)."""

    def __init__(self, calibrated: CalibratedModel, spec, path: Path | None = None):
        self.calibrated = calibrated
        self.spec = spec
        self.path = path
        self._calibration = hashlib.sha256(calibrated.to_json().encode()).hexdigest()[:16]
        self._stored: dict[str, list[str]] = self._read()
        self._changed = False

    def _read(self) -> dict[str, list[str]]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            stored = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # unreadable: picked again and written over
        return stored if isinstance(stored, dict) else {}

    def _key(self, kernel: KernelDef, problem: Problem) -> str:
        return "\n".join((self._calibration, kernel.name, kernel.source_hash(),
                          problem.static_key()))

    def for_problem(self, kernel: KernelDef, problem: Problem) -> tuple[Any, ...]:
        """The pick at each bucket of BUCKETS for `problem`'s static part."""
        key = self._key(kernel, problem)
        stored = self._stored.get(key)
        if isinstance(stored, list) and len(stored) == len(BUCKETS):
            try:
                return tuple(kernel.space.config_from_dict(json.loads(c)) for c in stored)
            except (TypeError, ValueError):
                pass  # a config of an older space: picked again
        picks = tuple(predicted_best(kernel, problem.with_tokens(b), self.spec,
                                     self.calibrated,
                                     kernel.default_config(problem.with_tokens(b), self.spec))
                      for b in BUCKETS)
        self._stored[key] = [config_to_json(c) for c in picks]
        self._changed = True
        return picks

    def save(self) -> None:
        """Write the picks worked out since the file was read (nothing where none were, or no
        file is kept; a file that cannot be written is warned about, and picked again next
        time)."""
        if self.path is None or not self._changed:
            return
        try:
            write_atomically(self.path, json.dumps(self._stored, sort_keys=True).encode())
            self._changed = False
        except OSError as err:
            log.warning("cutetune: cannot keep the predicted picks in %s: %s", self.path,
                        err.strerror)

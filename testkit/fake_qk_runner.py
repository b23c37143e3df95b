"""A stand-in for the GPU trial runner over qk_norm's points, for tests of the search and of
what stores and shows its results."""

from __future__ import annotations

from cutetune.device.measure import Measurement
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.results_db import DeviceFingerprint
from cutetune.tuner.study import TrialFailure

SPEC = DEVICE_SPECS["H200"]
CEILINGS = Ceilings.from_datasheet(SPEC)
FINGERPRINT = DeviceFingerprint("NVIDIA H200", "9.0", 132, "13.0", "13.0", "2.11", "4.8.1")


class FakeRunner:
    """Time = a smooth function of the config; points with 32-bit vectors fail to 'verify'.
    `measured` and `remeasured` record what was asked."""

    def __init__(self):
        self.measured = []
        self.remeasured = []

    @staticmethod
    def time_of(config) -> float:
        return 10.0 + abs(config.warps_per_block - 4) + abs(config.heads_per_warp - 2) * 0.5

    def measure(self, config):
        self.measured.append(config)
        if config.vector_bits == 32:
            raise TrialFailure("wrong result: q: 3 of 10 elements off")
        return Measurement(self.time_of(config), 0.1, 25)

    def remeasure(self, configs):
        self.remeasured.append(list(configs))
        return [Measurement(self.time_of(c) - 0.01, 0.05, 3) for c in configs]

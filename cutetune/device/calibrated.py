"""The calibrated cost model: the roofline's terms with their constants fitted to one device's
stored trials (calibration_fit.py fits them, `cutetune calibrate` stores them).

A point's predicted time is a sum of named terms, each a fitted constant times something the
kernel's Cost declares:

    launch   launches x launch_us          (a split form's second launch counts)
    waves    waves x wave_us               (each wave waits for at least one memory round trip)
    barrier  grid barriers x barrier_us
    memory   bytes / bandwidth / efficiency, where efficiency is the share of SMs the grid keeps
             busy x how full its waves are x the share of `in_flight_bytes` per SM (Little's
             law) its resident threads keep in flight (roofline.occupancy)

FLOPs count as the bytes the datasheet would move in the time the fp32 peak computes them, so a
compute-bound point is priced by the same fitted bandwidth. The sum is then multiplied by the
point's knob factor (knob_effects.py), where its kernel has them at its bucket. Importing this
module costs nothing beyond the roofline: a warmup reads a stored model and predicts with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from cutetune.device.knob_effects import KnobEffects, KnobPoint
from cutetune.device.roofline import Prediction, occupancy
from cutetune.device.specs import Ceilings, DeviceSpec
from cutetune.kernels.cost import Cost

# The model's form: a stored calibration of another form is not read as this one.
FORM = "waves-knobs-v1"
MB = 1e6


@dataclass(frozen=True)
class Terms:
    """One prediction as its named parts (microseconds), with what they were computed from."""

    launch_us: float
    waves_us: float
    barrier_us: float
    memory_us: float
    bytes_moved: int
    waves: int
    efficiency: float
    knob_factor: float = 1.0

    @property
    def total_us(self) -> float:
        return (self.launch_us + self.waves_us + self.barrier_us + self.memory_us) \
            * self.knob_factor

    def describe(self) -> str:
        knobs = f", x{self.knob_factor:.2f} for its knobs" if self.knob_factor != 1.0 else ""
        return (f"launch {self.launch_us:.2f} + waves {self.waves_us:.2f} ({self.waves}) + "
                f"barrier {self.barrier_us:.2f} + memory {self.memory_us:.2f} "
                f"({self.bytes_moved / MB:.3g} MB at {100 * self.efficiency:.0f}% efficiency)"
                f"{knobs}")


def datasheet_terms(cost: Cost, prediction: Prediction, ceilings: Ceilings) -> Terms:
    """The datasheet roofline's prediction (roofline.predict) as the same terms: it knows no
    per-wave latency, so its memory term is what is left after launches and barriers."""
    launch = cost.launches * ceilings.launch_floor_us
    barrier = cost.grid_barriers * ceilings.grid_barrier_us
    efficiency = prediction.sm_fraction * prediction.wave_efficiency * prediction.latency_hiding
    return Terms(launch, 0.0, barrier, prediction.predicted_us - launch - barrier,
                 cost.bytes_moved, prediction.waves, efficiency)


@dataclass(frozen=True)
class Features:
    """What the fitted constants multiply: the model is linear in them."""

    launches: int
    waves: int
    grid_barriers: int
    effective_mb: float  # MB at full bandwidth, stretched by the grid's efficiency
    efficiency: float

    def row(self) -> tuple[float, float, float, float]:
        return (self.launches, self.waves, self.grid_barriers, self.effective_mb)


def features(cost: Cost, spec: DeviceSpec, in_flight_bytes: float) -> Features:
    grid = occupancy(cost, spec, in_flight_bytes)
    bytes_per_flop = spec.dram_gbps * 1e9 / (spec.fp32_tflops * 1e12)
    moved = max(cost.bytes_moved, cost.flops * bytes_per_flop)
    return Features(cost.launches, grid.waves, cost.grid_barriers,
                    moved / MB / grid.efficiency, grid.efficiency)


@dataclass(frozen=True)
class CalibratedModel:
    """The fitted constants of one device, and how well they fit: `trials` verified trials,
    `median_error` the median of |predicted / measured - 1| over them (`datasheet_error` the
    datasheet roofline's), `over_2x` the share more than 2x off either way. `prune_factor`:
    how much slower than the best prediction a point may be predicted and still be measured
    (the spread of measured / predicted within a bucket, from the fit), for a kernel without
    knob factors; `knobs`: the knob factors and the prune factor of each kernel that has them."""

    gpu_name: str
    launch_us: float
    wave_us: float
    barrier_us: float
    us_per_mb: float
    in_flight_bytes: float
    prune_factor: float
    trials: int
    median_error: float
    datasheet_error: float
    over_2x: float
    knobs: KnobEffects = KnobEffects()
    form: str = FORM

    @property
    def bandwidth_gbps(self) -> float:
        return 1e3 / self.us_per_mb if self.us_per_mb else float("inf")

    def terms(self, cost: Cost, spec: DeviceSpec, point: KnobPoint | None = None) -> Terms:
        """The terms of `cost`, multiplied by the knob factor of `point` (kernel, bucket,
        config) where given."""
        f = features(cost, spec, self.in_flight_bytes)
        return Terms(f.launches * self.launch_us, f.waves * self.wave_us,
                     f.grid_barriers * self.barrier_us, f.effective_mb * self.us_per_mb,
                     cost.bytes_moved, f.waves, f.efficiency,
                     self.knobs.factor(*point) if point else 1.0)

    def predict_us(self, cost: Cost, spec: DeviceSpec, point: KnobPoint | None = None) -> float:
        return self.terms(cost, spec, point).total_us

    def prune_factor_of(self, kernel: str) -> float:
        return self.knobs.prune_factors.get(kernel, self.prune_factor)

    def describe(self) -> str:
        return (f"launch {self.launch_us:.2f} us, wave {self.wave_us:.3f} us, grid barrier "
                f"{self.barrier_us:.2f} us, bandwidth {self.bandwidth_gbps:.0f} GB/s, "
                f"{self.in_flight_bytes / 1024:.0f} KiB in flight per SM; prune over "
                f"{self.prune_factor:.2f}x the best (a kernel without knob factors); fitted "
                f"on {self.trials} trials: median error {100 * self.median_error:.1f}% (datasheet "
                f"{100 * self.datasheet_error:.1f}%), {100 * self.over_2x:.1f}% over 2x off; "
                f"{self.knobs.describe()}")

    def to_json(self) -> str:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return json.dumps({**values, "knobs": self.knobs.to_dict()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CalibratedModel:
        """ValueError where `text` is not a calibration of this form."""
        values = json.loads(text)
        if not isinstance(values, dict) or values.get("form") != FORM:
            raise ValueError(f"not a calibration of form {FORM}: {text[:80]!r}")
        names = {f.name for f in fields(cls)}
        if set(values) != names:
            raise ValueError(f"a calibration of form {FORM} has the fields {sorted(names)}, "
                             f"got {sorted(values)}")
        return cls(**{**values, "knobs": KnobEffects.from_dict(values["knobs"])})


def read_stored(text: str | None) -> CalibratedModel | None:
    """A stored calibration's JSON read back; None where there is none or it is of another
    form (an older cutetune's), which the datasheet model then replaces."""
    if text is None:
        return None
    try:
        return CalibratedModel.from_json(text)
    except ValueError:
        return None

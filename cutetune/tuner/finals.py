"""Naming a bucket's winner from its finalists, so that the same GPU names the same winner.

The finalists are re-measured side by side in interleaved rounds. Those whose re-measured
median is within the tie band of the fastest's are tied, and a fixed order picks among them
(the points other problems' stored winners lend first, then the heuristic default; below).
Without the band, fresh runs on one H200 named the same winner in only 6 of 10 buckets, the
others flipping between points 0.2-1.5% apart: the minimum of noisy times names whichever
near-tie read fastest that minute. With it, the winner changes only where a point is faster by
more than the noise.

The band is `max(floor, IQR / median)` of the fastest finalist's re-measurement (floor 3% by
default, `cutetune tune --tie-band`):
- the fastest's times are the reference every tie is measured from, and its IQR is the spread
  of the very rounds every finalist shared: two points closer than that spread swap places
  from one set of rounds to the next, and where the rounds caught the GPU in two states (a
  decode point reads about 0.2 us slower in one, docs/performance-notes.md) the IQR spans
  both and no closer call is trusted;
- the floor covers what one set of rounds does not see, the change between runs minutes apart,
  while the IQR of 25 replays is under 1% of the median for 95% of the H200 trials in
  tests/data/h200_results.db (half of them under 0.33%). Over four fresh H200 runs of two
  presets (benchmarks/results/winner-repro-b640aae) the ratio of the same two finalists moved
  by 0.5% at the median, 2.1% at p90 and 2.7% at p95, so the floor is 3%. Those runs' finals
  picked again at other floors (`python3 -m benchmarks.winner_repick`) name one winner in 41
  of 60 buckets at 2% (FlashInfer's autotuner's band), 48 at 3% and 54 at 5%, the picked
  point 0.33%, 0.48% and 0.67% slower than its run's fastest finalist at the median.
The price is at most the band: a tied point never loses more than that to the fastest.

The finalists' rounds run on FINAL_DRAWS draws of input sets (tuner/trials.py), each allocated
afresh at other addresses, the times pooled: between fresh runs the ratio of the same two
finalists moved by 2.1% at p90 and up to 8.9%, while one set of rounds saw under 1%, and a
fresh run differs from the last in where its inputs sit (and so in their L2 sets and DRAM
channels) as well as in time. Pooled, the fastest's IQR spans the placements the draws
caught, and so does the band built from it.

The fixed order is the incumbent first: the shipped winner of this very problem and bucket for
a GPU of this model, of the kernel's current source (tuner/model_run.py), what the dispatcher
serves here without the run. A run replaces it only with a point faster by more than the band,
so runs on GPUs of one model name the point shipped for them unless they measure better. Then
the lent points (the stored winners of the kernel's problems outside the run at this bucket:
device/funnel.py `lent_points`, alike in every run, which never writes them), then the default,
then the cost model's best-ranked (the lowest predicted time, to PREDICTION_DIGITS significant
digits, as the ceilings a fresh run measures move the predictions a little), then canonical
JSON. The best-ranked points are the warm start, which every run tries whatever its search
proposes after it, so where one of them is among the near-ties, every run has timed the one the
order picks; and the order leans toward the faster points, so the point it picks tends to sit
well inside the band rather than at its edge, where noise flips it. Picking again among the
stored finalists of four fresh H200 runs of two presets (72 buckets, their finalists admitted by
canonical JSON alone), this order named one winner in 49 buckets at a 2% band, and canonical
JSON alone in 46. The lent points lead the rest because they sit nearest the best: other
problems' winners come within 3% of a bucket's best in 84% of the H100's preset buckets
("Replayed searches"), the default in 43%, so the order's pick is seldom at the band's edge;
the warm start tries them in every run. Replayed over those measurements (`python3 -m
benchmarks.fresh_run_replay ... --lend`), five runs of each preset lent the other preset's bests
name one winner in 77% of 132 buckets, 0.20% slower than the best at the median, against 39%
and 0.87% without them; offered as well the winner of one more replayed run as the incumbent
(`--incumbent`, as a shipped winner is), in 83%, 0.13% slower. A run lends among none of its own
problems (tuner/model_run.py), so its buckets' searches do not depend on each other's outcome;
the incumbent is package data, the same for every run.

Which points are finalists is fixed as far as the search's times allow: the fastest few by
(median, canonical JSON), so that equal times rank the same way in every run; the default and
the incumbent; and the points the fixed order prefers among those within twice the band of the
fastest by their search-time medians (taken at different moments of the search, so further
apart than the same points side by side), so that the point the order would pick is
re-measured in every run that timed it near the top.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cutetune.device.measure import Measurement
from cutetune.spaces.space import config_to_json
from cutetune.tuner.defaults import DEFAULT_TIE_BAND_PERCENT

if TYPE_CHECKING:
    from cutetune.tuner.study import TrialOutcome

TIE_BAND_FLOOR = DEFAULT_TIE_BAND_PERCENT / 100
FASTEST = 3  # the fastest few of the search
PREFERRED = 3  # at most this many more: the order's first among the near-fastest
ADMISSION = 2.0  # near-fastest: within ADMISSION x the band, by search-time medians
FINAL_DRAWS = 3  # the finalists' rounds, each on input sets allocated afresh (tuner/trials.py)
PREDICTION_DIGITS = 3  # significant digits of the predicted time the fixed order compares


@dataclass(frozen=True)
class Finals:
    """The finalists as re-measured (in the order they were timed), the band, the winner, the
    default (re-measured beside it; None where it did not verify) and the incumbent offered
    (None where none was)."""

    finalists: tuple[TrialOutcome, ...]
    tie_band: float
    winner: TrialOutcome
    default: TrialOutcome | None
    incumbent: Any = None

    def attr(self) -> dict[str, Any]:
        """What a study keeps of its finals (JSON): why the winner won."""
        return {"tie_band": self.tie_band, "winner": config_to_json(self.winner.config),
                "incumbent": None if self.incumbent is None else config_to_json(self.incumbent),
                "finalists": [{"config": config_to_json(t.config),
                               "median_us": t.measurement.median_us,
                               "iqr_us": t.measurement.iqr_us,
                               "repeats": t.measurement.repeats} for t in self.finalists]}


def tie_band(fastest: Measurement, floor: float = TIE_BAND_FLOOR) -> float:
    """The relative gap below which two points count as tied (module docstring)."""
    if fastest.median_us <= 0:
        return floor
    return max(floor, fastest.iqr_us / fastest.median_us)


def preference(config: Any, default: Any, predicted_us: float, lent: Collection[Any] = (),
               incumbent: Any = None) -> tuple[bool, bool, bool, float, str]:
    """The fixed order among tied points (module docstring): the incumbent first, then the lent
    points, then the default, then the lowest predicted time, then canonical JSON."""
    return (config != incumbent, config not in lent, config != default,
            float(f"{predicted_us:.{PREDICTION_DIGITS}g}"), config_to_json(config))


def by_speed(outcomes: Sequence[TrialOutcome]) -> list[TrialOutcome]:
    """Fastest first; equal medians in canonical-JSON order, not in the order they were tried
    (which changes from run to run)."""
    return sorted(outcomes, key=lambda t: (t.measurement.median_us, config_to_json(t.config)))


def finalists(ok: Sequence[TrialOutcome], default: Any, floor: float = TIE_BAND_FLOOR,
              lent: Collection[Any] = (), incumbent: Any = None) -> list[TrialOutcome]:
    """The points to re-measure, fastest first (module docstring), from the verified ones."""
    ranked = by_speed(ok)
    if not ranked:
        return []
    fastest = ranked[0].measurement
    window = fastest.median_us * (1 + ADMISSION * tie_band(fastest, floor))
    near = sorted((t for t in ranked if t.measurement.median_us <= window),
                  key=lambda t: preference(t.config, default, t.predicted_us, lent, incumbent))
    chosen = ranked[:FASTEST] + near[:PREFERRED] + [t for t in ranked
                                                    if t.config in (default, incumbent)]
    return list({t.config: t for t in chosen}.values())


def pick(remeasured: Sequence[TrialOutcome], default: Any, floor: float = TIE_BAND_FLOOR,
         lent: Collection[Any] = (), incumbent: Any = None) -> Finals:
    """The winner among `remeasured` finalists (at least one): the preferred of those tied
    with the fastest. Each keeps its own measurement, so the winner's is its own times."""
    fastest = by_speed(remeasured)[0].measurement
    band = tie_band(fastest, floor)
    tied = [t for t in remeasured if t.measurement.median_us <= fastest.median_us * (1 + band)]
    winner = min(tied, key=lambda t: preference(t.config, default, t.predicted_us, lent,
                                                incumbent))
    return Finals(tuple(remeasured), band, winner,
                  next((t for t in remeasured if t.config == default), None), incumbent)


def remeasured(finals: Sequence[TrialOutcome],
               measurements: Sequence[Measurement]) -> list[TrialOutcome]:
    """`finals` with the times of their side-by-side re-measurement."""
    return [dataclasses.replace(t, measurement=m)
            for t, m in zip(finals, measurements, strict=True)]

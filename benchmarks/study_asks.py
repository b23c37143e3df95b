"""How many times the search asks Optuna for a point per trial it measures: the tuner's study
(tuner/study.py, TPE, its SQLite storage) over a model's real plans, each bucket in a study of
its own, with a stand-in runner that answers at once with the roofline's predicted time. TPE
proposes points the roofline pruned and points tried already; each is told and asked again,
and each ask and tell is a round trip to the results database, which is why a trial TPE
proposes costs the tuner more time than one the warm start enqueued (the ETA's prices,
tuner/eta.py). Needs no GPU; the counts depend only on the plans and the seed.

    python3 -m benchmarks.study_asks --model M [--kernels K,K] [--tokens 64,4096] [--budget 16]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.kernels.registry import NotApplicableError, get_kernel
from cutetune.spaces.models import load_model
from cutetune.tuner.defaults import DEFAULT_BUDGET
from cutetune.tuner.replay import ReplayRunner
from cutetune.tuner.study import run_study
from cutetune.tuner.study_storage import open_storage
from cutetune.tuner.tune import plan_bucket

DEFAULT_KERNELS = ("rmsnorm", "fp8_group_quant", "silu_and_mul")
DEFAULT_TOKENS = (64, 4096)


@dataclass(frozen=True)
class StudyAsks:
    kernel: str
    tokens: int
    candidates: int  # the roofline's survivors
    measured: int  # trials timed
    asks: int  # trials the study holds: measured, pruned and repeated
    exhaustive: bool
    seconds: float  # the search's wall time, the runner answering at once


def count_asks(model: str, kernels: Sequence[str], tokens: Sequence[int], budget: int,
               directory: Path) -> list[StudyAsks]:
    """The first problem of each kernel the model uses, at each of `tokens`, searched as the
    tuner searches it (datasheet ceilings of the H200)."""
    import optuna

    spec = DEVICE_SPECS["H200"]
    ceilings = Ceilings.from_datasheet(spec)
    storage = open_storage(f"sqlite:///{directory / 'studies.db'}")
    shape = load_model(model)
    rows = []
    for name in kernels:
        kernel = get_kernel(name)
        try:
            problem = kernel.problems_for_model(shape, "bfloat16")[0]
        except NotApplicableError:
            continue
        for count in tokens:
            planned = plan_bucket(kernel, problem, count, spec, ceilings)
            # Each point answered with its predicted time, at once.
            runner = ReplayRunner({p.config: p.prediction.predicted_us
                                   for p in planned.plan.kept})
            study_name = f"{name}-{count}"
            start = time.perf_counter()
            result = run_study(kernel, planned.plan, planned.default, runner, budget,
                               study_name, storage)
            seconds = time.perf_counter() - start
            asks = len(optuna.load_study(study_name=study_name, storage=storage)
                       .get_trials(deepcopy=False))
            rows.append(StudyAsks(name, count, len(planned.plan.kept), len(result.trials),
                                  asks, result.exhaustive, seconds))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a preset or a config.json")
    parser.add_argument("--kernels", default=",".join(DEFAULT_KERNELS))
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)))
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cutetune-asks-") as directory:
        rows = count_asks(args.model, [k for k in args.kernels.split(",") if k],
                          [int(t) for t in args.tokens.split(",")], args.budget,
                          Path(directory))
    print("kernel | tokens | candidates | measured | asks | exhaustive | seconds")
    for r in rows:
        print(f"{r.kernel} | {r.tokens} | {r.candidates} | {r.measured} | {r.asks} | "
              f"{'yes' if r.exhaustive else 'no'} | {r.seconds:.2f}")


if __name__ == "__main__":
    main()

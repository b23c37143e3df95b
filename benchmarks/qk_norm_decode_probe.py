"""Why decode-sized QK-norm timings move: the same point timed repeatedly through the tuner's
own path (GpuTrialRunner.measure), after the GPU idles for 0.7 s, directly on the same input
sets, on one L2-hot set, and after a matmul burst, with the SM clock and power that nvidia-smi
reports after each.

    python3 benchmarks/qk_norm_decode_probe.py
"""

import subprocess
import time

import torch

from cutetune.kernels import qk_norm as qk
from cutetune.spaces.models import load_model
from cutetune.tuner.measure import time_in_graph
from cutetune.tuner.roofline import DEVICE_SPECS
from cutetune.tuner.trials import GpuTrialRunner

SPEC = DEVICE_SPECS["H200"]
# The H200 winners of BENCHMARKS.md for qwen3-8b at 1 and 8 tokens.
POINTS = {1: qk.QKNormConfig(32, 2, 4), 8: qk.QKNormConfig(64, 1, 8)}


def clocks() -> str:
    query = ["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw",
             "--format=csv,noheader"]
    return subprocess.run(query, capture_output=True, text=True).stdout.strip()


def report(tokens: int, what: str, median_us: float, with_clocks: bool = True) -> None:
    print(f"{tokens:>2} tokens  {what:<22} {median_us:6.3f} us  {clocks() if with_clocks else ''}")


def main() -> None:
    static = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
    for tokens, config in POINTS.items():
        runner = GpuTrialRunner(qk.KERNEL, static.with_tokens(tokens), SPEC)
        print(f"{tokens:>2} tokens  idle: {clocks()}")
        for _ in range(3):
            report(tokens, "runner.measure", runner.measure(config).median_us)
        time.sleep(0.7)
        report(tokens, "after 0.7 s idle", runner.measure(config).median_us)
        compiled = runner.compiled(config)
        sets = runner._inputs()
        for name, inputs in (("same sets, direct", sets), ("one set (L2-hot)", sets[:1])):
            m = time_in_graph([lambda t=t, c=compiled: qk.launch(c, t) for t in inputs])
            report(tokens, name, m.median_us, with_clocks=False)
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        for _ in range(50):
            x @ x
        report(tokens, "after matmul burst", runner.measure(config).median_us)


if __name__ == "__main__":
    main()

"""A stand-in for cutetune.bench.ours_runner on the CPU, so that the bench's candidates (the
unfused chains among them) run without a GPU: each kernel's launch is its reference, written
where ours_runner's launch writes (outputs not written in place allocated per call by
with_fresh_outputs, the others in place)."""

from __future__ import annotations

from cutetune.device.measure import with_fresh_outputs


def reference_runner(served: list):
    """ours_runner's stand-in; `served` hears (kernel name, problem) of each runner made."""

    def runner(kernel, problem, config, points):
        served.append((kernel.name, problem))

        def run(tensors):
            expected = kernel.reference(tensors, problem)
            written = with_fresh_outputs(tensors, kernel.outputs, kernel.written_in_place)
            for name in kernel.outputs:
                written[name].copy_(expected[name])
            return {name: written[name] for name in kernel.outputs}

        return run

    return runner

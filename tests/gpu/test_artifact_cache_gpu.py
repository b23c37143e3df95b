"""A point loaded from the artifact cache computes what the freshly compiled point computes:
on a side stream (torch's current stream, which the launch takes) and replayed in a CUDA
graph, for every kernel."""

from __future__ import annotations

import pytest
import torch

from cutetune.build.artifacts import ArtifactStore, arch_for
from cutetune.device.specs import device_spec_for
from cutetune.device.verify import check_outputs
from cutetune.kernels.registry import get_kernel, kernel_names
from cutetune.results_db import DeviceFingerprint
from testkit.model_problems import first_model_problems

pytestmark = pytest.mark.gpu


def _problem(kernel, tokens: int):
    return first_model_problems(kernel)[0].with_tokens(tokens)


def _run(kernel, problem, compiled, seed: int, graph: bool):
    """Outputs of one run on inputs from `seed`, launched on a side stream, or captured in a
    CUDA graph there and replayed."""
    device = torch.device("cuda")
    tensors = kernel.make_inputs(problem, device, torch.Generator(device).manual_seed(seed))
    expected = kernel.reference(tensors, problem)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        if graph:
            kernel.launch(compiled, dict(tensors))  # loads the module outside the capture
            tensors = kernel.make_inputs(problem, device,
                                         torch.Generator(device).manual_seed(seed))
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured, stream=stream):
                kernel.launch(compiled, tensors)
            captured.replay()
        else:
            kernel.launch(compiled, tensors)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return tensors, expected


@pytest.mark.parametrize("name", kernel_names())
def test_a_loaded_point_computes_what_the_compiled_one_does(name, tmp_path):
    kernel = get_kernel(name)
    fingerprint = DeviceFingerprint.current()
    spec = device_spec_for(fingerprint.gpu_name)
    problem = _problem(kernel, 37)
    config = kernel.default_config(problem, spec)
    arch = arch_for(fingerprint.compute_capability)
    fresh = kernel.compile(problem, config)
    ArtifactStore(tmp_path, arch).compile(kernel, problem, config)
    loaded = ArtifactStore(tmp_path, arch).load(kernel, problem, config)  # as another process
    assert loaded is not None
    for graph in (False, True):
        ours, expected = _run(kernel, problem, loaded, seed=5, graph=graph)
        check_outputs(kernel, problem, ours, expected)
        if kernel.check is None:  # deterministic outputs: the same bits as the fresh compile
            theirs, _ = _run(kernel, problem, fresh, seed=5, graph=graph)
            for output in kernel.outputs:
                assert torch.equal(ours[output], theirs[output]), (output, graph)

"""Roofline model against numbers computed by hand (H200: 132 SMs, 2048 threads, 64 Ki
registers, 32 blocks and 228 KiB shared memory per SM)."""

import pytest

from cutetune.device.roofline import (
    BYTES_IN_FLIGHT_PER_SM,
    achieved_gbps,
    floor_us,
    percent_of_roofline,
    predict,
)
from cutetune.device.specs import DEVICE_SPECS, Ceilings, device_spec_for
from cutetune.kernels.cost import Cost, resident_blocks_per_sm

H200 = DEVICE_SPECS["H200"]
# Round numbers: 4200 GB/s copy ceiling, 0.5 us per launch, 1 us per grid barrier.
CEIL = Ceilings(copy_gbps=4200.0, launch_floor_us=0.5, grid_barrier_us=1.0, measured=True)


def cost(**kw) -> Cost:
    values = dict(bytes_moved=0, flops=0, blocks=1, threads_per_block=256,
                  registers_per_thread=32)
    values.update(kw)
    return Cost(**values)


@pytest.mark.parametrize(("threads", "registers", "smem", "expected"), [
    # Threads: 2048 / 512 = 4; registers would allow 65536 / (16 * 512) = 8.
    (512, 16, 0, 4),
    # Registers: 65536 / (128 * 256) = 2; threads would allow 2048 / 256 = 8.
    (256, 128, 0, 2),
    # Shared memory: 233472 // 102400 = 2; threads 16, registers 65536 / 4096 = 16.
    (128, 32, 100 * 1024, 2),
    # Block limit: threads 64, registers 64, but at most 32 blocks per SM.
    (32, 32, 0, 32),
    # Nothing fits: 255 * 1024 registers > 65536.
    (1024, 255, 0, 0),
])
def test_resident_blocks_per_sm(threads, registers, smem, expected):
    c = cost(threads_per_block=threads, registers_per_thread=registers, smem_per_block=smem)
    assert resident_blocks_per_sm(c, H200) == expected


def test_floor_is_bytes_at_the_copy_ceiling():
    # 4.2e9 bytes / 4200e9 bytes/s = 1e-3 s = 1000 us.
    assert floor_us(cost(bytes_moved=4_200_000_000), H200, CEIL) == pytest.approx(1000.0)


def test_floor_is_flops_when_compute_bound():
    # 6.7e9 FLOPs / 67e12 FLOP/s = 1e-4 s = 100 us, more than 4.2e6 bytes' 1 us.
    c = cost(bytes_moved=4_200_000, flops=6_700_000_000)
    assert floor_us(c, H200, CEIL) == pytest.approx(100.0)


# 256 threads x 32 registers: 8 resident blocks per SM, 8 * 132 = 1056 blocks per wave.
CAPACITY = 1056
ONE_US = 4_200_000  # bytes moved in 1 us at 4200 GB/s


def test_predict_full_wave_is_floor_plus_launch():
    p = predict(cost(bytes_moved=ONE_US, blocks=CAPACITY), H200, CEIL)
    assert p.resident_blocks_per_sm == 8
    assert (p.waves, p.sm_fraction, p.wave_efficiency, p.latency_hiding) == (1, 1.0, 1.0, 1.0)
    assert p.floor_us == pytest.approx(1.0)
    assert p.predicted_us == pytest.approx(0.5 + 1.0)


def test_predict_adds_every_launch_and_barrier():
    c = cost(bytes_moved=ONE_US, blocks=CAPACITY, launches=2, grid_barriers=3)
    # 2 * 0.5 + 3 * 1.0 + 1.0
    assert predict(c, H200, CEIL).predicted_us == pytest.approx(5.0)


def test_predict_wave_quantisation():
    p = predict(cost(bytes_moved=ONE_US, blocks=CAPACITY + 1), H200, CEIL)
    assert p.waves == 2
    # 1057 blocks over two waves of 1056 slots.
    assert p.wave_efficiency == pytest.approx(1057 / 2112)
    assert p.predicted_us == pytest.approx(0.5 + 2112 / 1057)
    p = predict(cost(bytes_moved=ONE_US, blocks=2 * CAPACITY), H200, CEIL)
    assert (p.waves, p.wave_efficiency) == (2, 1.0)


def test_predict_small_grid_leaves_sms_idle():
    p = predict(cost(bytes_moved=ONE_US, blocks=33), H200, CEIL)
    assert p.sm_fraction == pytest.approx(0.25)  # 33 of 132 SMs
    assert p.waves == 1
    assert p.predicted_us == pytest.approx(0.5 + 1.0 / 0.25)


def test_predict_latency_hiding_with_few_bytes_in_flight():
    assert BYTES_IN_FLIGHT_PER_SM == 32768
    # One warp per SM, 16 bytes per thread: 32 * 16 = 512 of the 32768 bytes needed -> 1/64.
    bytes_moved = 132 * 1_000_000
    c = cost(bytes_moved=bytes_moved, blocks=132, threads_per_block=32,
             bytes_in_flight_per_thread=16)
    p = predict(c, H200, CEIL)
    assert p.latency_hiding == pytest.approx(1 / 64)
    floor = bytes_moved / 4200e9 * 1e6  # 31.43 us
    assert p.floor_us == pytest.approx(floor)
    assert p.predicted_us == pytest.approx(0.5 + 64 * floor)

    # Two blocks per busy SM double the bytes in flight: 1/32.
    p = predict(cost(bytes_moved=bytes_moved, blocks=264, threads_per_block=32,
                     bytes_in_flight_per_thread=16), H200, CEIL)
    assert p.latency_hiding == pytest.approx(1 / 32)


def test_latency_hiding_is_capped_by_what_a_small_problem_moves():
    # 256 bytes per SM to move, 512 in flight: fully hidden, not 512 / 32768.
    c = cost(bytes_moved=132 * 256, blocks=132, threads_per_block=32,
             bytes_in_flight_per_thread=16)
    assert predict(c, H200, CEIL).latency_hiding == 1.0
    # Half of what is needed: 512 in flight of 1024 per SM.
    c = cost(bytes_moved=132 * 1024, blocks=132, threads_per_block=32,
             bytes_in_flight_per_thread=16)
    assert predict(c, H200, CEIL).latency_hiding == pytest.approx(0.5)


def test_predict_rejects_a_block_that_cannot_be_resident():
    with pytest.raises(ValueError, match="cannot be resident on H200"):
        predict(cost(threads_per_block=1024, registers_per_thread=255), H200, CEIL)


def test_percent_of_roofline_and_achieved_bandwidth():
    c = cost(bytes_moved=ONE_US)
    # Floor 1 us measured in 2 us: 50% of the roofline, 4.2e6 bytes / 2e-6 s = 2100 GB/s.
    assert percent_of_roofline(c, H200, CEIL, 2.0) == pytest.approx(50.0)
    assert achieved_gbps(c, 2.0) == pytest.approx(2100.0)
    assert percent_of_roofline(c, H200, CEIL, 1.0) == pytest.approx(100.0)


@pytest.mark.parametrize(("gpu", "spec"), [
    ("NVIDIA H200", "H200"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA B200", "B200"),
])
def test_device_spec_for_cuda_names(gpu, spec):
    assert device_spec_for(gpu) is DEVICE_SPECS[spec]


@pytest.mark.parametrize("gpu", ["NVIDIA A100-SXM4-80GB", "NVIDIA H20", "NVIDIA H100 PCIe",
                                 "NVIDIA H100 NVL", ""])
def test_device_spec_for_unknown_gpu_raises(gpu):
    with pytest.raises(ValueError, match="no DeviceSpec for GPU") as info:
        device_spec_for(gpu)
    for name in DEVICE_SPECS:
        assert name in str(info.value)


def test_h200_spec_matches_design():
    assert (H200.sm_count, H200.dram_gbps, H200.registers_per_sm) == (132, 4800.0, 65536)


def test_ceilings_from_datasheet():
    ceilings = Ceilings.from_datasheet(H200)
    assert ceilings.copy_gbps == pytest.approx(0.9 * 4800.0)
    assert (ceilings.launch_floor_us, ceilings.grid_barrier_us) == (0.55, 1.0)
    assert not ceilings.measured


def test_ceilings_from_measured_overrides_only_given_values():
    default = Ceilings.from_datasheet(H200)
    ceilings = Ceilings.from_measured(H200, {"copy_gbps": 4200.0})
    assert ceilings.copy_gbps == 4200.0
    assert ceilings.launch_floor_us == default.launch_floor_us
    assert ceilings.grid_barrier_us == default.grid_barrier_us
    assert ceilings.measured

    ceilings = Ceilings.from_measured(H200, {"launch_floor_us": 0.6, "grid_barrier_us": 1.2})
    assert (ceilings.copy_gbps, ceilings.launch_floor_us, ceilings.grid_barrier_us) == (
        default.copy_gbps, 0.6, 1.2)
    assert ceilings.measured

    assert Ceilings.from_measured(H200, {}) == default


def test_ceilings_reject_unknown_names():
    with pytest.raises(ValueError, match=r"unknown ceilings \['copy_gbs'\]"):
        Ceilings.from_measured(H200, {"copy_gbs": 4200.0})

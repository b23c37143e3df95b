"""The ops' fast path (cutetune.fast_path): after an op's checked path has served a CUDA call,
calls with the same key skip the op's checks and go from the op's route (C++) straight to the
kernel the dispatcher serves; a call the kernel refuses, one whose written rows overlap, one
with too few dispatched rows, one whose key differs and one served by the default take the
checked path. Checked on the CPU: the tensors pass for CUDA ones, and the kernels are
stand-ins (Python, called through TVM-FFI) that record their calls and refuse what TVM-FFI
would."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
import torch
import tvm_ffi

from cutetune import fast_path
from cutetune.build.publish import find_published
from cutetune.fast_call import Constant, Dim, DType, FastCall, Value
from cutetune.kernels.moe_dispatch.launcher import CompiledDispatch, CooperativeGridError
from cutetune.kernels.qk_norm import KERNEL as QK_KERNEL
from cutetune.kernels.rmsnorm import KERNEL as RMSNORM_KERNEL
from cutetune.ops import activation, fp8_quant, moe_combine, moe_dispatch, qk_norm, rmsnorm
from cutetune.ops.registry import ops, route_of
from cutetune.serving.table import Dispatcher
from cutetune.serving.warmup import set_current
from cutetune.spaces.buckets import BUCKETS, MAX_BUCKET
from testkit.op_problems import call_problems, public_call


class Launcher:
    """A compiled kernel's stand-in: records the data pointers of each call's tensors (and
    their shapes and strides, `layouts`);
    refuses, with the error type TVM-FFI raises, the calls whose tensors do not share the
    first one's dtype (int32, int64 and fp32 tensors aside, as the MoE kernels and rope take
    them, and one-byte floats, the quantisation kernels' outputs); raises
    `failure`, where set, once it has launched."""

    def __init__(self):
        self.calls = []
        self.layouts = []
        self.failure: Exception | None = None

    def __call__(self, *tensors):
        views = [torch.from_dlpack(t) for t in tensors if t is not None]
        rows = [t for t in views if t.dtype not in (torch.int32, torch.int64, torch.float32)
                and not (t.is_floating_point() and t.element_size() == 1)]
        if any(t.dtype is not rows[0].dtype for t in rows):
            raise ValueError("Mismatched Tensor on argument #1, expected dtype=bfloat16")
        self.calls.append(tuple(t.data_ptr() for t in views))
        self.layouts.append(tuple((tuple(t.shape), t.stride()) for t in views))
        if self.failure is not None:
            raise self.failure


@dataclass
class Served:
    launcher: Launcher
    dispatcher: Dispatcher
    default_buckets: set[int] = field(default_factory=set)


@pytest.fixture
def served(monkeypatch) -> Served:
    """The current dispatcher, serving one Launcher at every bucket of every static problem
    (the default at the buckets in `default_buckets`), with CPU tensors taken for CUDA ones."""
    served = Served(Launcher(), Dispatcher(None))
    kernel = tvm_ffi.convert(served.launcher)

    def install(self, kernel_def, problem, warmed_up, key):
        row = tuple((kernel, bucket in served.default_buckets) for bucket in BUCKETS)
        self._rows[key] = row
        return row

    monkeypatch.setattr(Dispatcher, "_install", install)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(moe_dispatch, "_workspace", lambda device, local: None)
    # The stand-in is no CompiledDispatch: the routes call it as it is.
    for op in ops():
        op_route = route_of(op.name)
        if op_route.fast_call.launch_function is not None:
            monkeypatch.setattr(op_route, "fast_call", dataclasses.replace(
                op_route.fast_call, launch_function=None))
    set_current(served.dispatcher)
    yield served
    set_current(None)


def bf16(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


def ids(tokens, top_k=8):
    return torch.zeros(tokens, top_k, dtype=torch.int32)


def counting_checks(monkeypatch, module) -> list:
    checked = []
    check = module._check_inputs

    def counted(*args):
        checked.append(args)
        return check(*args)

    monkeypatch.setattr(module, "_check_inputs", counted)
    return checked


def counting_lookups(monkeypatch) -> list:
    """The calls that reach the dispatcher: those of the checked path that launch."""
    looked = []
    serving = Dispatcher.serving

    def counted(self, *args):
        looked.append(args)
        return serving(self, *args)

    monkeypatch.setattr(Dispatcher, "serving", counted)
    return looked


@pytest.mark.parametrize("op", sorted(call_problems()))
def test_later_calls_with_a_key_skip_the_checks(op, served, monkeypatch):
    checked = counting_lookups(monkeypatch)
    public_call(op, 3)()
    public_call(op, 5)()
    public_call(op, 1)()
    assert len(checked) == 1
    assert len(served.launcher.calls) == 3


@pytest.mark.parametrize("op", sorted(call_problems()))
def test_a_new_dispatcher_starts_from_the_checked_path(op, served, monkeypatch):
    public_call(op, 2)()
    set_current(Dispatcher(None))
    checked = counting_lookups(monkeypatch)
    public_call(op, 2)()
    assert len(checked) == 1


def test_each_field_of_the_key_sends_a_changed_call_down_the_checked_path(served,
                                                                          monkeypatch):
    q, k, w = bf16(2, 32, 128), bf16(2, 8, 128), bf16(128)
    qk_norm.qk_norm(q, k, w, w)
    checked = counting_checks(monkeypatch, qk_norm)
    changed = [
        (q, k, w, w, 1e-5, 0.0),  # eps
        (q, k, w, w, 1e-6, 1.0),  # weight_bias
        (q, k, w, w, 1e-6, 0),  # the same value as an int: another key
        (bf16(2, 16, 128), k, w, w, 1e-6, 0.0),  # q_heads
        (q, bf16(2, 4, 128), w, w, 1e-6, 0.0),  # kv_heads
        (bf16(2, 32, 64), bf16(2, 8, 64), bf16(64), bf16(64), 1e-6, 0.0),  # head_dim
        tuple(t.half() if isinstance(t, torch.Tensor) else t
              for t in (q, k, w, w, 1e-6, 0.0)),  # dtype
    ]
    for arguments in changed:
        assert route_of("qk_norm").call(*arguments) is False
        qk_norm.qk_norm(*arguments)
    assert len(checked) == len(changed)
    assert route_of("qk_norm").call(q, k, w, w, 1e-6, 0.0) is True


def test_a_call_the_kernel_refuses_gets_the_checks_error(served):
    x = bf16(4, 3072)
    activation.silu_and_mul(x, out=bf16(4, 1536))
    with pytest.raises(TypeError, match="out has dtype torch.float16 but x has torch.bfloat16"):
        activation.silu_and_mul(x, out=torch.zeros(4, 1536, dtype=torch.float16))
    assert len(served.launcher.calls) == 1


def test_moe_dispatch_into_given_buffers_allocates_nothing(served, monkeypatch):
    x, topk_ids = bf16(3, 2048), ids(3)
    out = moe_dispatch.moe_dispatch_buffers(x, topk_ids, 128)
    allocated = []
    allocate = moe_dispatch._allocate
    monkeypatch.setattr(moe_dispatch, "_allocate",
                        lambda *args: allocated.append(args) or allocate(*args))
    for _ in range(3):
        assert moe_dispatch.moe_dispatch(x, topk_ids, 128, out=out) is out
    assert allocated == [] and len(served.launcher.calls) == 3
    assert served.launcher.calls[-1][2:7] == tuple(
        t.data_ptr() for t in (out.row_of, out.dispatched, out.counts, out.offsets, out.error))


def test_too_few_dispatched_rows_take_the_checked_path(served):
    x, topk_ids = bf16(3, 2048), ids(3)
    out = moe_dispatch.moe_dispatch_buffers(x, topk_ids, 128)
    moe_dispatch.moe_dispatch(x, topk_ids, 128, out=out)
    more = moe_dispatch.moe_dispatch_buffers(x, topk_ids, 128)
    more = dataclasses.replace(more, dispatched=bf16(out.dispatched.shape[0] + 5, 2048))
    moe_dispatch.moe_dispatch(x, topk_ids, 128, out=more)  # more rows than needed: served
    short = dataclasses.replace(out, dispatched=out.dispatched[:-1])
    with pytest.raises(ValueError, match=r"out.dispatched must be \(rows, 2048\) with rows >= "):
        moe_dispatch.moe_dispatch(x, topk_ids, 128, out=short)
    assert len(served.launcher.calls) == 2


def test_overlapping_written_rows_take_the_checked_path(served):
    x, weight = bf16(4, 4096), bf16(4096)
    rmsnorm.rmsnorm(x, weight, out=bf16(4, 4096))
    overlapping = bf16(1, 4096).expand(4, 4096)
    with pytest.raises(ValueError, match="non-overlapping rows"):
        rmsnorm.rmsnorm(x, weight, out=overlapping)
    expert_out, row_of, weights = bf16(4 * 8 + 64 * 15, 2048), ids(4), torch.zeros(4, 8)
    moe_combine.moe_combine(expert_out, row_of, weights, bf16(4, 2048), experts=128)
    with pytest.raises(ValueError, match="out's not overlapping"):
        moe_combine.moe_combine(expert_out, row_of, weights, bf16(1, 2048).expand(4, 2048),
                                experts=128)
    assert len(served.launcher.calls) == 2


def test_no_expert_rows_take_the_checked_path(served):
    row_of, weights = ids(2), torch.zeros(2, 8)
    moe_combine.moe_combine(bf16(64, 2048), row_of, weights, experts=128)
    out = moe_combine.moe_combine(bf16(0, 2048), row_of, weights, experts=128)
    assert len(served.launcher.calls) == 1 and out.shape == (2, 2048)


def test_an_out_dtype_other_than_outs_takes_the_checked_path(served):
    x, weight = bf16(2, 4096), bf16(4096)
    rmsnorm.rmsnorm(x, weight, out=bf16(2, 4096))
    with pytest.raises(TypeError):
        rmsnorm.rmsnorm(x, weight, out=bf16(2, 4096), out_dtype=torch.float32)
    assert len(served.launcher.calls) == 1


def test_an_out_dtype_that_is_outs_is_served_by_the_route(served, monkeypatch):
    x, weight = bf16(2, 4096), bf16(4096)
    looked = counting_lookups(monkeypatch)
    for _ in range(2):
        rmsnorm.rmsnorm(x, weight, out=torch.zeros(2, 4096), out_dtype=torch.float32)
    for _ in range(2):  # the out allocated in out_dtype: the same key
        assert rmsnorm.rmsnorm(x, weight, out_dtype=torch.float32).dtype is torch.float32
    assert len(looked) == 1 and len(served.launcher.calls) == 4


@pytest.mark.parametrize("op", sorted(call_problems()))
def test_an_error_the_kernel_raises_once_launched_propagates_and_is_not_run_again(op, served):
    public_call(op, 2)()  # the checked path, which tells the route
    served.launcher.failure = RuntimeError("an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        public_call(op, 2)()
    assert len(served.launcher.calls) == 2


def test_calls_served_by_the_default_take_the_checked_path_and_are_counted(served,
                                                                           monkeypatch):
    served.default_buckets = {4}
    checked = counting_checks(monkeypatch, activation)
    for tokens in (2, 4, 2, 3):
        activation.silu_and_mul(bf16(tokens, 3072))
    # The first call told the route, which serves the second call of 2 tokens; the calls of
    # the default bucket 4 (3 and 4 tokens) each took the checked path.
    assert len(checked) == 3
    assert sum(served.dispatcher.default_calls().values()) == 2


def test_calls_beyond_the_largest_bucket_take_the_checked_path(served, monkeypatch):
    checked = counting_checks(monkeypatch, activation)
    activation.silu_and_mul(bf16(MAX_BUCKET, 64))
    activation.silu_and_mul(bf16(MAX_BUCKET, 64))  # served by the route
    for _ in range(2):
        activation.silu_and_mul(bf16(MAX_BUCKET + 1, 64))
    assert len(checked) == 3
    assert sum(served.dispatcher.beyond_calls().values()) == 2


@pytest.mark.parametrize("given", [False, True], ids=["allocated", "given"])
def test_the_fp8_route_passes_the_kernel_what_the_checked_path_does(served, given,
                                                                   monkeypatch):
    """Column-major scales reach the kernel as their transpose, (groups, tokens) rows of the
    padded token stride, on the route as on the checked path; q is (tokens, width)."""
    looked = counting_lookups(monkeypatch)
    x = bf16(5, 512)
    buffers = {}
    for _ in range(2):  # the checked path, then the route
        if given:
            buffers = {"out": torch.empty(5, 512, dtype=torch.float8_e4m3fn),
                       "scales": torch.empty_strided((5, 4), (1, 8))}
        q, scales = fp8_quant.fp8_group_quant(x, 128, column_major_scales=True, **buffers)
        assert served.launcher.calls[-1][1:] == (q.data_ptr(), scales.data_ptr())
    assert len(looked) == 1  # the second call took the route
    checked, routed = served.launcher.layouts
    assert checked == routed == (((5, 512), (512, 1)), ((5, 512), (512, 1)), ((4, 5), (8, 1)))


def test_zero_tokens_take_the_checked_path(served, monkeypatch):
    activation.silu_and_mul(bf16(2, 3072))
    checked = counting_checks(monkeypatch, activation)
    assert activation.silu_and_mul(bf16(0, 3072)).shape == (0, 1536)
    assert len(checked) == 1 and len(served.launcher.calls) == 1


def test_a_route_reads_every_static_field_once():
    fields = {"dtype": DType("x"), "out_dtype": DType("out"), "hidden": Dim("x", 1),
              "eps": Value("eps"), "weight_bias": Constant(0.0)}
    with pytest.raises(ValueError, match=r"missing \['fused_add'\], not fields \[\]"):
        fast_path.Route(RMSNORM_KERNEL, FastCall(
            arguments=("x", "out", "eps"), launched=2, tokens=Dim("x", 0), fields=fields))
    with pytest.raises(ValueError, match=r"readings name \['y'\]"):
        FastCall(arguments=("x",), launched=1, tokens=Dim("y", 0), fields={})
    with pytest.raises(ValueError, match="kernel qk_norm has a route already"):
        fast_path.route(QK_KERNEL, route_of("qk_norm").fast_call)


def test_moe_dispatch_serves_a_grid_only_where_it_fits_the_device(monkeypatch):
    compiled = CompiledDispatch.__new__(CompiledDispatch)
    compiled.fn = object()

    def fits(device):
        if device == 1:
            raise CooperativeGridError("too many blocks for device 1")

    compiled.check_device = fits
    assert moe_dispatch._launch_function(compiled, 0) is compiled.fn
    assert moe_dispatch._launch_function(compiled, 1) is None


def test_without_a_compiler_every_call_takes_the_checked_path(monkeypatch, caplog):
    monkeypatch.setattr(fast_path, "_built", [])
    monkeypatch.setenv("CXX", "no-such-compiler")
    with caplog.at_level("WARNING", logger="cutetune.fast_path"):
        assert fast_path.load_library() is False
        assert fast_path.load_library() is False
    assert [r.getMessage() for r in caplog.records] == [
        "cutetune: the ops' fast path cannot be built (no C++ compiler: install g++ or set "
        "CXX); every op call takes the checked path, several microseconds more host time"]


def test_a_damaged_library_is_never_loaded_but_built_again(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("CUTETUNE_CACHE_DIR", str(tmp_path))
    plan = fast_path._build_plan()
    plan.stem.parent.mkdir(parents=True)
    damaged = plan.stem.parent / f"{plan.stem.name}-0123456789abcdef.so"
    damaged.write_bytes(b"\x7fELF truncated")
    monkeypatch.setattr(fast_path, "_built", [])
    with caplog.at_level("WARNING", logger="cutetune.fast_path"):
        assert fast_path.load_library()
    assert not damaged.exists()
    assert "is damaged; building the fast path again" in caplog.text
    [built] = plan.stem.parent.glob("*.so")
    assert find_published(plan.stem) == (built, [])


def test_a_kernel_that_wraps_its_function_is_served_through_it():
    function = tvm_ffi.convert(Launcher())

    class Wrapped:  # as CuTeDSL wraps a function whose signature has defaults
        def __tvm_ffi_object__(self):
            return function

    gelu_route = route_of("gelu_and_mul")
    assert gelu_route._function(Wrapped(), 0) is function
    assert gelu_route._function(function, 0) is function
    assert gelu_route._function(Launcher(), 0) is None
    assert gelu_route._function(None, 0) is None


def test_a_cache_dir_that_cannot_be_written_builds_in_a_temporary_one(monkeypatch, tmp_path,
                                                                      caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("CUTETUNE_CACHE_DIR", str(blocked / "cache"))
    monkeypatch.setattr(fast_path, "_built", [])
    with caplog.at_level("WARNING", logger="cutetune.fast_path"):
        assert fast_path.load_library()
    assert [r.getMessage() for r in caplog.records] == [
        f"cutetune: {blocked / 'cache' / fast_path.FAST_PATH_DIR} cannot be written (Not a "
        "directory); building the fast path in a temporary directory"]


def test_a_key_longer_than_the_route_holds_is_refused():
    fields = {name: Value("eps") for name in qk_norm.QKNormProblem.static_names()}
    wide = dataclasses.make_dataclass(
        "Wide", [(f"f{i}", float) for i in range(16)], bases=(qk_norm.QKNormProblem,),
        frozen=True, kw_only=True)
    kernel = dataclasses.replace(QK_KERNEL, name="wide", problem_type=wide)
    fields.update({f"f{i}": Value("eps") for i in range(16)})
    with pytest.raises(ValueError, match="reads a key of 45 words; fast_path.cc holds 40"):
        fast_path.Route(kernel, FastCall(arguments=("q", "eps"), launched=1,
                                         tokens=Dim("q", 0), fields=fields))


@pytest.mark.parametrize(("expert_range", "pad"), [((96, 32), 16), ((32, 96), 0)],
                         ids=["empty-range", "no-pad"])
def test_sizes_the_outputs_cannot_have_get_the_checks_error(served, expert_range, pad):
    with pytest.raises(ValueError):
        moe_dispatch.moe_dispatch(bf16(3, 2048), ids(3), 128, pad=pad, expert_range=expert_range)
    assert served.launcher.calls == []


def test_a_call_the_route_does_not_serve_allocates_its_outputs_once(served, monkeypatch):
    served.default_buckets = set(BUCKETS)  # every call takes the checked path
    allocated = []
    allocate = moe_dispatch._allocate
    monkeypatch.setattr(moe_dispatch, "_allocate",
                        lambda *args: allocated.append(args) or allocate(*args))
    for _ in range(2):
        moe_dispatch.moe_dispatch(bf16(3, 2048), ids(3), 128)
    assert len(allocated) == 2 and len(served.launcher.calls) == 2


def test_a_keyed_argument_is_served_only_with_a_value_a_checked_call_had():
    route = fast_path.Route(RMSNORM_KERNEL, FastCall(
        arguments=("x", "out", "eps", "weight_bias", "fused_add", "out_dtype"), launched=2,
        tokens=Dim("x", 0),
        fields={"dtype": DType("x"), "out_dtype": DType("out"), "hidden": Dim("x", 1),
                "eps": Value("eps"), "weight_bias": Value("weight_bias"),
                "fused_add": Value("fused_add")},
        keyed=("out_dtype",)))
    launcher = Launcher()
    x, out = bf16(2, 64), torch.zeros(2, 64)
    route.remember((x, out, 1e-6, 0.0, False, torch.float32),
                   [tvm_ffi.convert(launcher)] * len(BUCKETS), None, 0)
    assert route.call(x, out, 1e-6, 0.0, False, torch.float32) is True
    assert route.call(x, out, 1e-6, 0.0, False, None) is False
    assert route.call(x, out, 1e-6, 0.0, False, torch.bfloat16) is False
    assert len(launcher.calls) == 1

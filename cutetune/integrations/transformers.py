"""cutetune's kernels in a loaded Hugging Face transformers model, in one call:

    from cutetune.integrations.transformers import patch, unpatch
    report = patch(model)   # installs the forwards; on a GPU, warms up the model's kernels
    print(report)           # what was replaced, what was left alone and why
    unpatch(model)          # the original forwards again

Families: Llama, Qwen3, Qwen3-MoE and Gemma 3 (text, or the text model inside the multimodal
one). Per decoder layer: the RMSNorms (the residual add after attention fused into the next
norm, Gemma's (1 + w) scale included), the attention's rotary embedding in one launch, in place
on the q and k projections (qk_norm_rope, the per-head q/k norm with it, in Qwen3, Qwen3-MoE
and Gemma 3; rope in Llama), the gated MLP's activation (gate_proj and up_proj computed as one
GEMM whose output is [gate | up]) and Qwen3-MoE's token shuffle (moe_dispatch and moe_combine
around grouped GEMMs on the experts' stacked weights).

The rotation's positions are the position_ids transformers passes each attention; its theta
and frequency scaling (plain, Llama 3's, YaRN's or linear: Gemma 3's full-attention layers')
are read from the config's rope_parameters (Gemma 3's per kind of layer) and checked, once,
against the frequencies transformers' rotary module holds. A kind of layer whose rotation the
ops do not state (a scaling they do not compute, such as longrope; YaRN in the fused
qk_norm_rope; frequencies rounded by casting the model after loading) keeps transformers'
rotation, after the q/k norm in one launch where the family has one, and the report says why.
The rotating ops index a cos/sin cache, which the patch adds to the rotary module with
config.max_position_embeddings rows and grows (doubling, eagerly: never inside a CUDA graph
capture) before a call whose positions may pass them, by a bound known on the host: the KV
cache's length plus the query's (a static cache's capacity). position_ids a caller passes
beyond that bound must stay below the cache's rows: the kernels do not check them, and
checking on the device would wait for it.

A module is replaced only where the op's own input checks accept its shape and dtype (a
zero-token call at patch time: no kernel is looked up or launched for it); the others are left
alone and listed with the op's reason. No module object is replaced: the patch binds forwards
to the instances and adds non-persistent buffers: to each gated MLP its fused gate/up weight,
whose slices the original Linear weights then view, so the weights are held once and the
state_dict is unchanged; to the rotary module the cos/sin caches. Patch after moving the model
to its device and dtype (load it in its dtype: a cast after loading rounds the rotary module's
frequencies). The ops have no backward: the patched model is for inference.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cutetune.integrations import hf_forwards as fw
from cutetune.integrations.patch_report import PatchEntry, PatchReport
from cutetune.kernels import rope as rope_kernel
from cutetune.kernels.dtypes import DTYPE_NAMES
from cutetune.kernels.moe_common import DEFAULT_PAD
from cutetune.kernels.qk_norm_rope import SCALINGS as QK_NORM_ROPE_SCALINGS
from cutetune.kernels.registry import NotApplicableError
from cutetune.kernels.rope import RopeProblem
from cutetune.kernels.rope_frequencies import inverse_frequencies
from cutetune.ops.activation import gelu_and_mul, silu_and_mul
from cutetune.ops.moe_combine import moe_combine
from cutetune.ops.moe_dispatch import moe_dispatch
from cutetune.ops.qk_norm import qk_norm
from cutetune.ops.qk_norm_rope import qk_norm_rope
from cutetune.ops.rmsnorm import fused_add_rmsnorm, rmsnorm
from cutetune.ops.rope import rope
from cutetune.serving.warmup import warmup as warmup_dispatcher
from cutetune.spaces.models import ModelShape, model_from_hf_config

# config.model_type -> the prefix of the family's modeling classes.
FAMILIES = {"llama": "Llama", "qwen3": "Qwen3", "qwen3_moe": "Qwen3Moe", "gemma3": "Gemma3",
            "gemma3_text": "Gemma3"}
# Gemma 3 normalises after attention and after the MLP too; its residual add after attention
# precedes the pre-feedforward norm, the other families' the post-attention norm.
_FUSED_NORM = {"Gemma3": "pre_feedforward_layernorm"}
# Gemma's norms scale by (1 + w).
_WEIGHT_BIAS = {"Gemma3": 1.0}
# hidden_act -> (the op's name in the report, the op): the gated activations cutetune fuses,
# as transformers' ACT2FN defines them.
ACTIVATIONS: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = {
    "silu": ("silu_and_mul", silu_and_mul),
    "swish": ("silu_and_mul", silu_and_mul),
    "gelu": ("gelu_and_mul", functools.partial(gelu_and_mul, approximate="none")),
    "gelu_pytorch_tanh": ("gelu_and_mul(tanh)",
                          functools.partial(gelu_and_mul, approximate="tanh")),
}
_STATE = "_cutetune_patch"
# The installed forwards follow the modeling code of the transformers releases from the first
# (major, minor) to the last, both included (the tested range): the decoder layers' and the
# attentions' forwards, the MoE block's router and stacked experts. An older release computes
# differently and is refused; a newer one is patched with a warning, its modules checked for
# every attribute the forwards read. pyproject.toml's `hf` extra pins the same range (a test
# compares them): change both together.
FOLLOWED_RELEASES = ((5, 17), (5, 25))
TRANSFORMERS_VERSIONS = " to ".join(f"{major}.{minor}" for major, minor in FOLLOWED_RELEASES)


class NotPatchableError(ValueError):
    pass


class UntestedTransformersWarning(UserWarning):
    """transformers is newer than the tested range: patch checked that the modules have what
    the forwards read, not that they compute what those releases' modules compute."""


# The releases already warned about: patch warns once per process, whatever the filters.
_warned: set[str] = set()


def _release(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return None if match is None else (int(match[1]), int(match[2]))


def follows(version: str) -> bool:
    """Whether `version` (transformers.__version__) is a release in the tested range, whose
    modeling code the forwards follow."""
    release = _release(version)
    first, last = FOLLOWED_RELEASES
    return release is not None and first <= release <= last


def _check_release(version: str) -> None:
    """Refuse a release older than the tested range (or unreadable); warn, once, of a newer
    one."""
    release = _release(version)
    first, last = FOLLOWED_RELEASES
    if release is None or release < first:
        raise NotPatchableError(
            f"cutetune patches models of transformers {first[0]}.{first[1]} and newer (tested "
            f"with {TRANSFORMERS_VERSIONS}); this is transformers {version}: upgrade it, e.g. "
            "pip install 'cutetune[hf]'")
    if release > last and version not in _warned:
        _warned.add(version)
        warnings.warn(
            f"transformers {version} is newer than the releases cutetune's forwards are "
            f"tested with ({TRANSFORMERS_VERSIONS}): patching anyway; compare the patched "
            "model's outputs with the unpatched model's, or pip install 'cutetune[hf]'",
            UntestedTransformersWarning, stacklevel=3)


@dataclass(frozen=True)
class _Install:
    """What the patch does to one module: its bound forward (None: its own stays), the
    buffers it adds, and the Parameters that become views of them."""

    module: torch.nn.Module
    forward: Callable | None
    buffers: tuple[tuple[str, torch.Tensor], ...] = ()
    views: tuple[tuple[torch.nn.Parameter, torch.Tensor], ...] = ()


@dataclass(frozen=True)
class _PatchState:
    installs: tuple[_Install, ...]
    report: PatchReport


def patch(model: torch.nn.Module, warmup: bool = True) -> PatchReport:
    """Serve `model`'s norms, rotary embeddings (with the q/k norms), gated activations and
    MoE token shuffle with cutetune's ops, and return the report of what was replaced and what
    was left alone (print it for a table). With warmup=True and the model on a GPU,
    `cutetune.warmup` first loads and compiles the kernels for the model's shapes (from its
    config). A family cutetune does not know, a transformers release older than the tested
    range (TRANSFORMERS_VERSIONS), or a module without an attribute its forward reads raises
    NotPatchableError naming what is wrong, and changes nothing. A release newer than the
    tested range is patched after one UntestedTransformersWarning."""
    import transformers

    _check_release(transformers.__version__)
    if _STATE in vars(model):
        raise NotPatchableError("the model is already patched by cutetune: unpatch it first")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    prefix = FAMILIES.get(model_type)
    if prefix is None:
        raise NotPatchableError(
            f"cutetune cannot patch {type(model).__name__} (model_type {model_type!r}): it "
            f"patches {', '.join(FAMILIES)} models")
    shape = model_from_hf_config(config.to_dict(), name=config.name_or_path or model_type)
    dtype = model.dtype
    installs, entries = _Planner(prefix, shape, dtype, transformers.__version__).plan(model)
    device = next(model.parameters()).device
    if not warmup:
        warmed = "not asked for"
    elif device.type != "cuda":
        warmed = (f"skipped: the model is on {device.type}, where the ops compute with their "
                  "kernels' references")
    elif not installs:
        warmed = "skipped: nothing was replaced"
    else:
        warmup_dispatcher(shape, dtype=DTYPE_NAMES[dtype])
        warmed = f"kernels for {shape.name} ({DTYPE_NAMES[dtype]}) loaded and compiled"
    for install in installs:
        for name, buffer in install.buffers:
            install.module.register_buffer(name, buffer, persistent=False)
        for parameter, view in install.views:
            parameter.data = view
        if install.forward is not None:
            install.module.forward = install.forward
    report = PatchReport(family=prefix, entries=tuple(entries), warmup=warmed)
    setattr(model, _STATE, _PatchState(tuple(installs), report))
    return report


def unpatch(model: torch.nn.Module) -> None:
    """Restore the forwards `patch` replaced and drop the buffers it added. Each gated MLP's
    gate and up Parameters stay views of one tensor: the same objects and values as before the
    patch."""
    state = vars(model).get(_STATE)
    if state is None:
        raise NotPatchableError("the model is not patched by cutetune")
    for install in state.installs:
        if install.forward is not None:
            del install.module.forward
        for name, _ in install.buffers:
            delattr(install.module, name)
    delattr(model, _STATE)


def patch_report(model: torch.nn.Module) -> PatchReport | None:
    """The report of the patch in force on `model`; None when it is not patched."""
    state = vars(model).get(_STATE)
    return None if state is None else state.report


def _refusal(call: Callable[[], object]) -> str:
    """'' when the op accepts the call, else its one-line reason. The calls are for zero
    tokens: the op's input checks run, no kernel is looked up or launched."""
    try:
        call()
    except (TypeError, ValueError) as err:
        return str(err)
    return ""


def _lacks(module: object, paths: tuple[str, ...]) -> str:
    """The first of the dotted `paths` that `module` lacks, cut after its first missing part
    ('experts' for 'experts.down_proj' when there are no experts); '' when it has them all."""
    for path in paths:
        obj = module
        parts = path.split(".")
        for i, part in enumerate(parts):
            if not hasattr(obj, part):
                return ".".join(parts[:i + 1])
            obj = getattr(obj, part)
    return ""


class _Planner:
    """Decides, module by module, what `patch` installs; changes nothing."""

    def __init__(self, prefix: str, shape: ModelShape, dtype: torch.dtype, version: str):
        self.prefix = prefix
        self.version = version
        self.shape = shape
        self.dtype = dtype
        self.weight_bias = _WEIGHT_BIAS.get(prefix, 0.0)
        self.fused_norm = _FUSED_NORM.get(prefix, "post_attention_layernorm")
        self.installs: list[_Install] = []
        self.entries: list[PatchEntry] = []
        # The model's rotary embedding module, the rotations of its kinds of layer (None: the
        # model's one kind), and the rope problem and rows of each cos/sin cache no install
        # holds yet.
        self.rotary: torch.nn.Module | None = None
        self.rotations: dict[str | None, tuple[fw.Rotation | None, str]] = {}
        self.unheld_caches: dict[str, tuple[RopeProblem, int]] = {}
        # Modules whose work a patched parent now does (the fused norms, q/k norms, experts).
        self.folded: set[int] = set()

    def plan(self, model: torch.nn.Module) -> tuple[list[_Install], list[PatchEntry]]:
        modules = list(model.named_modules())
        p = self.prefix
        rotaries = [m for _, m in modules if type(m).__name__ == f"{p}RotaryEmbedding"]
        self.rotary = rotaries[0] if len(rotaries) == 1 else None
        # Parents first: each folds its children's work into its own forward.
        for kind, plan_one in ((f"{p}DecoderLayer", self._layer),
                               (f"{p}Attention", self._attention),
                               (f"{p}SparseMoeBlock", self._moe_block),
                               (f"{p}MLP", self._mlp),
                               (f"{p}RMSNorm", self._norm)):
            for name, module in modules:
                if type(module).__name__ == kind and id(module) not in self.folded:
                    plan_one(name, module)
        return self.installs, self.entries

    def _require(self, name: str, module: torch.nn.Module, forward: Callable,
                 *also: str) -> None:
        """Refuse the model unless `module` has every attribute `forward` reads and the planner
        reads (`also`): a newer release that renames one fails here, not inside a forward."""
        missing = _lacks(module, (*forward.reads, *also))
        if missing:
            raise self._missing(name, module, f"attribute {missing!r}")

    def _missing(self, name: str, module: torch.nn.Module, what: str) -> NotPatchableError:
        return NotPatchableError(
            f"cutetune cannot patch {name} ({type(module).__name__}): it has no {what}, which "
            f"cutetune reads (transformers {self.version}; the forwards follow "
            f"{TRANSFORMERS_VERSIONS})")

    def _eps(self, name: str, norm: torch.nn.Module) -> float:
        for attr in ("variance_epsilon", "eps"):  # Llama and Qwen3 call it the first, Gemma eps
            if hasattr(norm, attr):
                return float(getattr(norm, attr))
        raise self._missing(name, norm, "attribute 'variance_epsilon' or 'eps'")

    def _empty(self, *size: int, like: torch.nn.Module, dtype: torch.dtype | None = None):
        device = next(like.parameters()).device
        return torch.empty(*size, dtype=dtype or self.dtype, device=device)

    def _entry(self, name: str, op: str, reason: str, note: str = "") -> bool:
        self.entries.append(PatchEntry(name, op, not reason, reason or note))
        return not reason

    def _layer(self, name: str, layer: torch.nn.Module) -> None:
        forward = (fw.sandwich_norm_layer_forward if self.prefix in _FUSED_NORM
                   else fw.pre_norm_layer_forward)
        self._require(name, layer, forward)
        norm = getattr(layer, self.fused_norm)
        eps, hidden = self._eps(f"{name}.{self.fused_norm}", norm), norm.weight.shape[0]
        reason = _refusal(lambda: fused_add_rmsnorm(
            self._empty(0, hidden, like=norm), self._empty(0, hidden, like=norm), norm.weight,
            eps=eps, weight_bias=self.weight_bias))
        if not self._entry(name, "fused_add_rmsnorm", reason,
                           f"residual add after attention fused into {self.fused_norm}"):
            return
        self.installs.append(_Install(layer, functools.partial(
            forward, layer, eps=eps, weight_bias=self.weight_bias)))
        self.folded.add(id(norm))

    def _attention(self, name: str, attn: torch.nn.Module) -> None:
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        normed = q_norm is not None and k_norm is not None
        self._require(name, attn, fw.attention_forward, "q_proj.out_features",
                      "k_proj.out_features",
                      *(("q_norm.weight", "k_norm.weight", "sliding_window") if normed else ()))
        # What the module's own forward calls, from its modeling module.
        modeling = sys.modules[type(attn).__module__]
        missing = _lacks(modeling, fw.MODELING_FUNCTIONS)
        if missing:
            raise self._missing(name, attn, f"{missing!r} in its modeling module "
                                            f"{modeling.__name__}")
        rotation, unrotated = self._rotation(attn)
        if normed:
            rotate, fused = self._qk_norm_rotate(name, attn, modeling, rotation, unrotated)
        else:
            rotate, fused = self._rope_rotate(name, attn, rotation, unrotated)
        if rotate is None:
            return
        if fused is not None:
            self._hold_cache(fused)
        self.installs.append(_Install(attn, functools.partial(
            fw.attention_forward, attn, rotate=rotate,
            eager_attention_forward=modeling.eager_attention_forward,
            attention_functions=modeling.ALL_ATTENTION_FUNCTIONS)))
        if normed:
            self.folded.update((id(q_norm), id(k_norm)))

    def _qk_norm_rotate(self, name: str, attn: torch.nn.Module, modeling,
                        rotation: fw.Rotation | None, unrotated: str):
        """(the rotate function, the rotation it passes to the op or None) of an attention
        with q/k norms: the fused qk_norm_rope where it computes the rotation, else qk_norm
        then transformers' apply_rotary_pos_emb; (None, None) where qk_norm refuses too."""
        eps, d = self._eps(f"{name}.q_norm", attn.q_norm), attn.head_dim
        k_eps = self._eps(f"{name}.k_norm", attn.k_norm)
        q, k = self._heads(attn)
        weights = dict(eps=eps, weight_bias=self.weight_bias)
        if k_eps != eps:
            self._entry(name, "qk_norm", f"q_norm's eps {eps} differs from k_norm's {k_eps}")
            return None, None
        if rotation is not None and rotation.scaling["scaling"] not in QK_NORM_ROPE_SCALINGS:
            unrotated = (f"the {rotation.scaling['scaling']} scaling is not one qk_norm_rope "
                         f"computes ({', '.join(QK_NORM_ROPE_SCALINGS)})")
        elif rotation is not None:
            unrotated = _refusal(lambda: qk_norm_rope(
                self._empty(0, dtype=torch.int64, like=attn), q, k, attn.q_norm.weight,
                attn.k_norm.weight, self._cache_stand_in(d, attn), rotation.theta, eps,
                self.weight_bias, True, **rotation.scaling))
        if not unrotated:
            scaled = ("" if rotation.problem.scaling == rope_kernel.DEFAULT
                      else f", {rotation.problem.scaling} scaling")
            self._entry(name, "qk_norm_rope", "", "q_norm, k_norm and RoPE "
                        f"(theta {rotation.theta:g}{scaled}) in one launch, in place")
            return functools.partial(fw.qk_norm_rope_in_place, rotation=rotation,
                                     **weights), rotation
        reason = _refusal(lambda: qk_norm(q, k, attn.q_norm.weight, attn.k_norm.weight,
                                          **weights))
        if not self._entry(name, "qk_norm", reason, "q_norm and k_norm in one launch; RoPE by "
                                                    f"transformers: {unrotated}"):
            return None, None
        return functools.partial(fw.qk_norm_then_rotary, **weights,
                                 apply_rotary_pos_emb=modeling.apply_rotary_pos_emb), None

    def _rope_rotate(self, name: str, attn: torch.nn.Module, rotation: fw.Rotation | None,
                     unrotated: str):
        """(the rotate function, its rotation) of an attention without q/k norms (Llama):
        cutetune's rope; (None, None) where it cannot serve the rotation."""
        if rotation is not None:
            q, k = self._heads(attn)
            unrotated = _refusal(lambda: rope(
                self._empty(0, dtype=torch.int64, like=attn), q, k,
                self._cache_stand_in(attn.head_dim, attn), rotation.theta, True,
                **rotation.scaling))
        if not self._entry(name, "rope", unrotated, "RoPE of q and k in one launch, in place"):
            return None, None
        return functools.partial(fw.rope_in_place, rotation=rotation), rotation

    def _heads(self, attn: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero-token q and k of the attention's heads, for the ops' input checks."""
        d = attn.head_dim
        return (self._empty(0, attn.q_proj.out_features // d, d, like=attn),
                self._empty(0, attn.k_proj.out_features // d, d, like=attn))

    def _cache_stand_in(self, rotary_dim: int, like: torch.nn.Module) -> torch.Tensor:
        """One row of a cos/sin cache, for the ops' input checks (which read its width): the
        cache itself is built only for a rotation the patch installs."""
        return self._empty(1, rotary_dim, like=like)

    def _rotation(self, attn: torch.nn.Module) -> tuple[fw.Rotation | None, str]:
        """The attention's rotary embedding as rope's arguments, and '' (the same for every
        layer of its kind); or None and why transformers' rotary module computes something
        they do not state."""
        parameters = getattr(getattr(attn, "config", None), "rope_parameters", None)
        if not isinstance(parameters, dict):
            return None, "its config states no rope_parameters"
        # Gemma 3 states the parameters per kind of layer, and its rotary module holds each
        # kind's frequencies under the kind's name.
        kind = None if "rope_type" in parameters else getattr(attn, "layer_type", None)
        if kind is not None:
            parameters = parameters.get(kind)
        if kind not in self.rotations:
            self.rotations[kind] = self._derive_rotation(attn, kind, parameters)
        return self.rotations[kind]

    def _derive_rotation(self, attn: torch.nn.Module, kind: str | None,
                         parameters) -> tuple[fw.Rotation | None, str]:
        """See _rotation: rope's problem of the kind's rope parameters (as a warmup reads a
        config's), checked against the inverse frequencies and the cos/sin scale transformers'
        rotary module holds, which its forward turns into the cos and sin the unpatched
        attention rotates by."""
        if self.rotary is None:
            return None, (f"the model has no single {self.prefix}RotaryEmbedding, whose "
                          "frequencies the patch would check")
        if not isinstance(parameters, dict):
            return None, f"its config states no rope_parameters for its layer kind {kind!r}"
        prefix = "" if kind is None else f"{kind}_"
        inv_freq = getattr(self.rotary, f"{prefix}inv_freq", None)
        scale = getattr(self.rotary, f"{prefix}attention_scaling", None)
        if not isinstance(inv_freq, torch.Tensor) or scale is None:
            return None, (f"{type(self.rotary).__name__} has no {prefix}inv_freq and "
                          f"{prefix}attention_scaling, which the patch checks")
        raw = {key: value for key, value in attn.config.to_dict().items()
               if key not in ("rope_theta", "rope_scaling", "rope_local_base_freq")}
        layer_shape = model_from_hf_config({**raw, "rope_parameters": parameters},
                                           name=self.shape.name)
        try:
            (problem,) = rope_kernel.problems_for_model(layer_shape, DTYPE_NAMES[self.dtype])
        except NotApplicableError as err:
            return None, str(err)
        if problem.mrope != rope_kernel.MROPE_NONE:
            return None, "its multimodal RoPE rotates by three position streams"
        want = inverse_frequencies(problem.rotary_dim, problem.theta, problem.llama3,
                                   problem.yarn, problem.linear)
        if inv_freq.dtype != torch.float32:
            # transformers builds them in fp32; a model cast after loading (model.to(dtype))
            # casts them too, and rotates by the rounded frequencies, which theta does not give.
            return None, (f"{type(self.rotary).__name__}'s frequencies are {inv_freq.dtype}, "
                          "rounded by a cast of the model (load it in its dtype instead)")
        held = inv_freq.detach().to("cpu", torch.float64)
        # transformers computes them in fp32: each within a few fp32 ulps of the exact value.
        if held.shape != want.shape or not torch.allclose(held, want, rtol=1e-5, atol=0):
            return None, (f"{type(self.rotary).__name__}'s frequencies are not those of "
                          f"theta {problem.theta:g} and the {problem.scaling} scaling")
        if not math.isclose(float(scale), problem.attention_factor, rel_tol=1e-6):
            return None, (f"{type(self.rotary).__name__} scales cos and sin by {scale}, not "
                          f"{problem.attention_factor}")
        rows = getattr(attn.config, "max_position_embeddings", None)
        if not isinstance(rows, int) or rows < 1:
            return None, ("its config states no max_position_embeddings, the positions of the "
                          "cos/sin cache")
        rotation = fw.Rotation(self.rotary,
                               fw.COS_SIN_CACHE + ("" if kind is None else f"_{kind}"), problem)
        self.unheld_caches[rotation.cache] = (problem, rows)
        return rotation, ""

    def _hold_cache(self, rotation: fw.Rotation) -> None:
        """Add the rotation's cos/sin cache to the rotary module, once for all its layers."""
        unheld = self.unheld_caches.pop(rotation.cache, None)
        if unheld is None:
            return  # an earlier layer's install holds it
        problem, rows = unheld
        device = next(self.rotary.buffers()).device
        self.installs.append(_Install(self.rotary, None, buffers=(
            (rotation.cache, fw.cos_sin_cache(problem, rows, self.dtype, device)),)))

    def _activation(self, intermediate: int, like: torch.nn.Module):
        """(op name, op, '') for the model's activation, or (name, None, reason)."""
        act = self.shape.hidden_act
        if act not in ACTIVATIONS:
            return act, None, (f"activation {act!r} is not one cutetune fuses (it fuses "
                               f"{', '.join(ACTIVATIONS)})")
        op_name, op = ACTIVATIONS[act]
        reason = _refusal(lambda: op(self._empty(0, 2 * intermediate, like=like)))
        return op_name, op, reason

    def _mlp(self, name: str, mlp: torch.nn.Module) -> None:
        self._require(name, mlp, fw.gated_mlp_forward, "gate_proj.out_features",
                      "gate_proj.weight", "up_proj.weight")
        gate, up = mlp.gate_proj, mlp.up_proj
        op_name, op, reason = self._activation(gate.out_features, mlp)
        if not reason:
            reason = _linear_refusal(gate, up)
        if not self._entry(name, op_name, reason, "gate_proj and up_proj as one GEMM"):
            return
        fused = torch.cat([gate.weight.detach(), up.weight.detach()])
        self.installs.append(_Install(
            mlp, functools.partial(fw.gated_mlp_forward, mlp, act_and_mul=op),
            buffers=((fw.GATE_UP_WEIGHT, fused),),
            views=((gate.weight, fused[:gate.out_features]),
                   (up.weight, fused[gate.out_features:]))))

    def _moe_block(self, name: str, block: torch.nn.Module) -> None:
        self._require(name, block, fw.sparse_moe_forward, "gate.top_k", "experts.hidden_dim",
                      "experts.intermediate_dim")
        router, experts = block.gate, block.experts
        count, hidden, intermediate = (router.num_experts, experts.hidden_dim,
                                       experts.intermediate_dim)
        op_name, op, reason = self._activation(intermediate, block)
        if not reason:
            reason = _experts_refusal(experts, count, hidden, intermediate)
        if not reason:
            reason = _refusal(lambda: moe_dispatch(
                self._empty(0, hidden, like=block),
                self._empty(0, router.top_k, like=block, dtype=torch.int32), count,
                pad=DEFAULT_PAD))
        if not reason:
            reason = _refusal(lambda: moe_combine(
                self._empty(0, hidden, like=block),
                self._empty(0, router.top_k, like=block, dtype=torch.int32),
                self._empty(0, router.top_k, like=block, dtype=torch.float32),
                experts=count, pad=DEFAULT_PAD))
        if not reason and not hasattr(torch, "_grouped_mm"):
            reason = f"torch {torch.__version__} has no torch._grouped_mm for the experts"
        if self._entry(name, f"moe_dispatch, {op_name}, moe_combine", reason,
                       f"{count} experts' GEMMs as grouped GEMMs"):
            self.installs.append(_Install(block, functools.partial(
                fw.sparse_moe_forward, block, pad=DEFAULT_PAD, act_and_mul=op)))

    def _norm(self, name: str, norm: torch.nn.Module) -> None:
        self._require(name, norm, fw.rmsnorm_forward)
        eps, hidden = self._eps(name, norm), norm.weight.shape[0]
        reason = _refusal(lambda: rmsnorm(self._empty(0, hidden, like=norm), norm.weight,
                                          eps=eps, weight_bias=self.weight_bias))
        if self._entry(name, "rmsnorm", reason):
            self.installs.append(_Install(norm, functools.partial(
                fw.rmsnorm_forward, norm, eps=eps, weight_bias=self.weight_bias)))


def _experts_refusal(experts: torch.nn.Module, count: int, hidden: int,
                     intermediate: int) -> str:
    """'' when the experts' weights are what the grouped GEMMs read: every one of the router's
    `count` experts' [gate; up] and down projections stacked, as Qwen3-MoE's own experts hold
    them (a model sharded across devices by expert holds only its own experts)."""
    want = {"gate_up_proj": (count, 2 * intermediate, hidden),
            "down_proj": (count, hidden, intermediate)}
    for weight, shape in want.items():
        got = tuple(getattr(experts, weight).shape)
        if got != shape:
            return (f"the experts' {weight} is {got}, not {shape}: not every routed expert's "
                    "weights are stacked here")
    return ""


def _linear_refusal(*linears: torch.nn.Module) -> str:
    for linear in linears:
        if type(linear) is not torch.nn.Linear:
            return f"a projection is {type(linear).__name__}, not torch.nn.Linear"
        if linear.bias is not None:
            return "the projections have biases, which the fused weights do not carry"
    return ""

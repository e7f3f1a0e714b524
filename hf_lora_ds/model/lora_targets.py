"""Where the adapters go: ``--lora_target_modules`` and ``--lora_target_experts`` checked against the model and, on a
Mixture-of-Experts model, resolved into the exact names PEFT takes.

PEFT adapts fused 3-D expert weights only through ``target_parameters`` (``lora.ParamWrapper``), per-expert Linear
modules through ``target_modules``; ``all-linear`` alone reaches neither on most families. PEFT 0.21 also rewrites the
targets of Mixtral- and Qwen2-MoE-style models for transformers-4 adapters (``convert_peft_config_for_transformers``):
it adapts the router, doubles the rank of ``gate_up_proj``, and drops every ``gate_proj``/``up_proj``/``down_proj``
layer from the targets, the first dense layers and the shared experts of DeepSeek-V3 and GLM-4.5 included
(huggingface/peft#3711), and such an adapter does not load back. So on a MoE model the targets become exact names
(``resolve_targets``), and PEFT's rewrite is kept off them (``peft_keeps_exact_targets``). A user's
plain ``PeftModel.from_pretrained`` runs that rewrite all the same, so the Linear layers it would take for experts
(Qwen2-MoE's and Qwen3-Next's ``shared_expert.*_proj``, DeepSeek-V3's dense MLPs) are adapted through their weights
(``target_parameters``: ``shared_expert.up_proj.weight``), which the rewrite leaves alone: the same factors, saved under
the same keys, but an adapter that PEFT loads back as it was trained.

Hybrid models' sequence mixers (hf_lora_ds.model.layer_kinds) keep the layers whose weights a kernel reads directly
out of every target: their depthwise convolution, a state-space mixer's ``out_proj`` (the causal-conv1d and Mamba
kernels take ``self.conv1d.weight``, ``outproj_weight=self.out_proj.weight``: a LoRA there would train on the CPU and
be skipped on a GPU; PEFT refuses both outright on Nemotron-H and Falcon-H1), and any layer the mixer's code multiplies
by its weight itself (Jamba's ``dt_proj``). Their input projections are adapted.

The flags travel in the fields ``LoraConfig`` already has, so a config built by hand means the same:

- ``target_modules``: ``all-linear`` is every linear layer but the head, the routers and the gates; a list names
  layers (a router too, when named), and on a MoE model the expert weights of those names as well;
- ``target_parameters``: None is ``--lora_target_experts auto`` (the experts as the linear layers), ``[]`` none, a list
  the expert weights' names;
- ``rank_pattern``/``alpha_pattern`` under ``EXPERT_PATTERN``: ``--lora_expert_rank``, scaling unchanged.

ParamWrapper refuses ``lora_dropout`` (it adds to a weight: there is no adapter input to drop), so with expert weights
adapted the config PEFT sees (and the saved one) says 0, and the dropout goes on the other adapters' inputs.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from peft import LoraConfig
from peft.tuners.lora import LoraLayer
from peft.tuners.lora.layer import ParamWrapper
from peft.utils.transformers_weight_conversion import convert_peft_config_for_transformers
from transformers.pytorch_utils import Conv1D

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.lora_init import lora_init_from_peft
from hf_lora_ds.config.vision import FROZEN_VISION, VisionTraining
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.experts import MoeBlock, expert_weight_names, experts_per_token, moe_blocks, unwrapped_name
from hf_lora_ds.model.experts_kernel import experts_kernel_text
from hf_lora_ds.model.layer_kinds import sequence_mixers
from hf_lora_ds.vision.modules import PROJECTOR, TOWER, full_training_modules, lora_scope, vision_parts

__all__ = [
    "EXPERT_PATTERN",
    "LORA_LAYER_TYPES",
    "add_dropout",
    "check_target_modules",
    "expert_fields",
    "experts_line",
    "parse_targets",
    "peft_keeps_exact_targets",
    "resolve_targets",
]

# Layer types PEFT's LoRA can adapt (bitsandbytes' 4/8-bit linears are nn.Linear subclasses).
LORA_LAYER_TYPES = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, Conv1D)
# A routed expert weight, as PEFT matches rank_pattern keys: "...experts.gate_up_proj", "...experts.3.w1".
EXPERT_PATTERN = r"experts\.(?:\d+\.)?[^.]+"
# A fused weight holds the per-expert layers transformers 4 named apart (Mixtral's w1/w3/w2).
# The starts PEFT's ParamWrapper builds and trains from (the others read or hook a Linear weight).
_PARAMETER_INITS = ("default", "gaussian")
_FUSED_PARTS = {"gate_up_proj": ("gate_proj", "up_proj", "w1", "w3"), "up_proj": ("w3",), "down_proj": ("w2",)}


def parse_targets(text: str) -> str | list[str]:
    """``--lora_target_modules`` as PEFT takes it: ``all-linear`` as it is, else the list of names."""
    targets = text.strip()
    return targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]


def expert_fields(args: SFTTrainingArguments) -> dict:
    """The ``LoraConfig`` fields of ``--lora_target_experts`` and ``--lora_expert_rank``."""
    experts = args.lora_target_experts.strip()
    names = [] if experts == "none" else [name.strip() for name in experts.split(",") if name.strip()]
    fields: dict = {"target_parameters": None if experts == "auto" else names}
    rank = args.lora_expert_rank
    if rank is not None and rank != args.lora_rank:
        ratio = rank / args.lora_rank  # the experts' alpha follows their rank: alpha / r (or / sqrt(r)) stays
        fields["rank_pattern"] = {EXPERT_PATTERN: rank}
        fields["alpha_pattern"] = {EXPERT_PATTERN: args.lora_alpha * (math.sqrt(ratio) if args.use_rslora else ratio)}
    return fields


def check_target_modules(model: torch.nn.Module, config: LoraConfig, vision: VisionTraining = FROZEN_VISION) -> None:
    """Every name in ``--lora_target_modules`` must name a layer LoRA can adapt (PEFT's rule: the module's full name
    or its last dotted parts), on a vision-language model in a part ``vision`` lets LoRA adapt. PEFT itself raises a
    traceback only when no name matches at all, and trains the others silently when one of several is a typo."""
    if config.target_modules is None or isinstance(config.target_modules, str):  # PEFT's default, "all-linear"
        return
    layers = list(_layers_outside_experts(model, [], vision))
    unknown = [target for target in config.target_modules if not _named(layers, target)]
    if unknown:
        _refuse_outside_scope(model, config.target_modules, unknown)
        _refuse_unknown(config.target_modules, unknown, {name.rsplit(".", 1)[-1] for name in layers}, "")


def resolve_targets(model: torch.nn.Module, config: LoraConfig, vision: VisionTraining = FROZEN_VISION) -> LoraConfig:
    """``config`` with exact targets for the MoE or vision-language ``model`` (a copy: the caller's config keeps the
    flags' words); ``config`` itself for a dense text model, where PEFT's own matching is right. A MoE family's model
    without an MoE layer (the planner's one-layer copy of DeepSeek-V3, whose first layers are dense) is resolved too:
    PEFT would rewrite its targets all the same. On a vision-language model the targets reach the parts ``vision``
    sets to lora only (hf_lora_ds.vision.modules), and the parts set to full go to ``modules_to_save``."""
    blocks = moe_blocks(model)
    kernel_read = _kernel_read_layers(model)
    saved_in_full = full_training_modules(model, vision)
    modules_to_save = [*(config.modules_to_save or []), *saved_in_full] or None
    if not blocks and experts_per_token(getattr(model, "config", None)) is None:
        if config.target_parameters:
            raise UserError(
                f"--lora_target_experts {','.join(config.target_parameters)}: the model has no experts "
                "(it is not a Mixture-of-Experts model); drop the flag"
            )
        check_target_modules(model, config, vision)
        if not kernel_read and vision_parts(model) is None:
            return config
        if config.target_modules is None:  # PEFT's default targets by model type: it has none for any VLM
            raise UserError("--lora_target_modules: none named; name the layers to adapt, or use all-linear")
        _refuse_kernel_read(config.target_modules, kernel_read)
        layers = _layers_outside_experts(model, [], vision)
        named = _all_linear(model, layers, []) if isinstance(config.target_modules, str) else layers
        modules = [name for name in named if name not in kernel_read and _targeted(name, config.target_modules)]
        _refuse_bare_lora_parts(model, modules, config.target_modules, vision)
        return dataclasses.replace(config, target_modules=sorted(modules), modules_to_save=modules_to_save)
    _refuse_kernel_read(config.target_modules, kernel_read)
    layers = _layers_outside_experts(model, blocks, vision)
    layers = {name: layer for name, layer in layers.items() if name not in kernel_read}
    routers = _router_weights(model, blocks, layers)
    if isinstance(config.target_modules, str):  # all-linear: the routers and gates never
        modules = _all_linear(model, layers, blocks)
        parameters = []
    else:
        weights = expert_weight_names(blocks)
        targets = config.target_modules
        unknown = [t for t in targets if not (_named(layers, t) or _named(routers, t) or _expert_names(weights, t))]
        if unknown:
            names = {n.rsplit(".", 1)[-1] for n in [*layers, *routers]} | set(weights)
            _refuse_unknown(targets, unknown, names, " and expert weights")
        modules = [name for name in layers if any(_named([name], t) for t in targets)]
        parameters = [weight for router, weight in routers.items() if any(_named([router], t) for t in targets)]
    modules, rewritten = _beside_peft_rewrite(model, modules)
    parameters += rewritten
    chosen = _chosen_expert_weights(blocks, config)
    parameters += [p for block in blocks for p in block.fused_parameters() if p.rsplit(".", 1)[-1] in chosen]
    modules += [linear for block in blocks for linear in block.expert_linears if linear.rsplit(".", 1)[-1] in chosen]
    if parameters:
        _check_parameter_adapters(config)
    _refuse_bare_lora_parts(model, modules, config.target_modules, vision)
    return dataclasses.replace(
        config,
        modules_to_save=modules_to_save,
        target_modules=sorted(modules),
        target_parameters=sorted(parameters) or None,
        lora_dropout=0.0 if parameters else config.lora_dropout,
    )


@contextmanager
def peft_keeps_exact_targets() -> Iterator[None]:
    """PEFT's transformers-4 rewrite of the targets skipped for configs that name only the model's own modules
    (``resolve_targets``'s, and the adapters saved from them), around a wrap or a load. Remove once PEFT ships the
    fix of huggingface/peft#3711 (PR 3715)."""
    from peft.utils import transformers_weight_conversion as conversion

    rewrite = conversion.convert_peft_config_for_transformers

    def rewrite_unless_exact(peft_config, model, conversions=None) -> None:
        targets = peft_config.target_modules
        names = {name for name, _ in model.named_modules()}
        if isinstance(targets, (list, set, tuple)) and targets and set(targets) <= names:
            return
        rewrite(peft_config, model, conversions)

    conversion.convert_peft_config_for_transformers = rewrite_unless_exact
    try:
        yield
    finally:
        conversion.convert_peft_config_for_transformers = rewrite


def add_dropout(model: torch.nn.Module, dropout: float) -> None:
    """``dropout`` on the input of every adapter but the expert weights' (which PEFT builds without it)."""
    if not dropout:
        return
    for module in model.modules():
        if isinstance(module, LoraLayer) and not isinstance(module, ParamWrapper):
            for adapter in module.lora_dropout:
                module.lora_dropout[adapter] = torch.nn.Dropout(p=dropout)


def experts_line(model: torch.nn.Module, dropout: float) -> str | None:
    """One line on the experts of a wrapped MoE model (None for a dense one): the expert weights adapted, in how many
    MoE layers, their rank, the router, where the dropout went, and the kernel."""
    blocks = moe_blocks(model)
    if not blocks:
        return None
    adapters = {}  # (module, fused weight or None) -> its LoRA layer
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            adapters[unwrapped_name(name), getattr(module, "parameter_name", None)] = module
    adapted: dict[str, set[int]] = {}  # expert weight name -> ranks
    tuned_blocks = 0
    for block in blocks:
        weights = [(name, (block.experts, name)) for name in block.fused]
        weights += [(linear.rsplit(".", 1)[-1], (linear, None)) for linear in block.expert_linears]
        hits = [(name, key) for name, key in weights if key in adapters]
        tuned_blocks += bool(hits)
        for name, key in hits:
            adapted.setdefault(name, set()).update(adapters[key].r.values())
    experts = "/".join(str(n) for n in sorted({block.num_experts for block in blocks}))
    kernel = experts_kernel_text(model)
    if not adapted:
        return f"experts: no LoRA on the routed experts ({experts} experts in {len(blocks)} MoE layers); {kernel}"
    ranks = "/".join(str(r) for r in sorted(set().union(*adapted.values())))
    kind = " (fused)" if any(block.fused for block in blocks) else ""
    routers = any(module in block.routers for block in blocks for module, _ in adapters)
    parts = [
        f"experts: LoRA on {', '.join(adapted)}{kind} of {experts} experts in {tuned_blocks}/{len(blocks)} MoE "
        f"layers, rank {ranks} each",
        "router adapted (named)" if routers else "router not adapted",
    ]
    if dropout and kind:
        parts.append(f"lora_dropout {dropout:g} on the other adapters only (PEFT cannot drop a fused weight's input)")
    return "; ".join([*parts, kernel])


def _kernel_read_layers(model: torch.nn.Module) -> dict[str, str]:
    """The sequence mixers' layers whose weights a kernel reads directly (the module docstring) -> what they are: the
    convolution and a Mamba ``out_proj`` always, and any layer whose weight the mixer's own code reads (Jamba's
    ``self.dt_proj.weight @ ...``: a LoRA there would change the merged model only)."""
    layers = {}
    for mixer, kind in sequence_mixers(model).items():
        module = model.get_submodule(mixer)
        read = set(re.findall(r"self\.(\w+)\.weight", _source(type(module))))
        for name, child in module.named_children():
            if isinstance(child, torch.nn.Conv1d):
                layers[f"{mixer}.{name}"] = f"the {kind} layers' depthwise convolution"
            elif kind == "state space" and name == "out_proj":
                layers[f"{mixer}.{name}"] = "the state-space (Mamba) layers' output projection"
            elif name in read and isinstance(child, torch.nn.Linear):
                layers[f"{mixer}.{name}"] = f"the {kind} layers' {name}, whose weight the layer reads itself"
    return layers


def _source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # no source shipped: the convolution and out_proj rules still hold
        return ""


def _refuse_kernel_read(targets, kernel_read: dict[str, str]) -> None:
    """A named target that reaches a layer of ``_kernel_read_layers``, refused in one line (PEFT raises a traceback
    for some families, and silently trains an adapter the GPU kernel skips for the others)."""
    if isinstance(targets, str):
        return
    for target in targets:
        hit = next((name for name in kernel_read if _named([name], target)), None)
        if hit:
            raise UserError(
                f"--lora_target_modules {','.join(sorted(targets))}: {target} names {kernel_read[hit]} ({hit}), whose "
                "weight the mixer's kernels read directly, so LoRA cannot adapt it; leave it out (the mixer's in_proj "
                "is adapted), or use 'all-linear'"
            )


def _targeted(name: str, targets) -> bool:
    return isinstance(targets, str) or any(_named([name], target) for target in targets)


def _beside_peft_rewrite(model: torch.nn.Module, modules: list[str]) -> tuple[list[str], list[str]]:
    """``modules`` split into those PEFT's transformers-4 rewrite keeps and, as their weights, those it would take
    for expert weights on a plain ``from_pretrained`` (the module docstring); PEFT's own rewrite says which."""
    taken = {module for module in modules if _taken_by_peft_rewrite(model, module)}
    return [m for m in modules if m not in taken], [f"{m}.weight" for m in modules if m in taken]


def _taken_by_peft_rewrite(model: torch.nn.Module, module: str) -> bool:
    """Whether PEFT's rewrite turns the layer ``module`` into an expert weight. Asked one layer at a time: it refuses
    half of a pair it fuses (``gate_proj`` without ``up_proj``), and that refusal says the same."""
    probe = LoraConfig(target_modules=[module])
    try:
        convert_peft_config_for_transformers(probe, model, None)
    except ValueError:
        return True
    return module not in (probe.target_modules or ())


def _check_parameter_adapters(config: LoraConfig) -> None:
    """What PEFT's ParamWrapper cannot build, refused in one line instead of its traceback: DoRA, and the starts
    that read a Linear weight (PiSSA, OLoRA, CorDA, LoftQ, orthogonal: a fused stack has no ``.weight``) or hook
    one (EVA's data pass)."""
    leave = "or --lora_target_experts none to leave the experts (and routers) without LoRA"
    if config.use_dora:
        raise UserError(f"--use_dora: PEFT has no DoRA for fused expert weights (lora.ParamWrapper); drop it, {leave}")
    init = lora_init_from_peft(config.init_lora_weights)
    if init.name not in _PARAMETER_INITS:
        raise UserError(
            f"--lora_init {init.name}: PEFT starts fused expert weights (lora.ParamWrapper) only as "
            f"{' or '.join(_PARAMETER_INITS)}; use one of those, {leave}"
        )


def _chosen_expert_weights(blocks: list[MoeBlock], config: LoraConfig) -> set[str]:
    """The names of the expert weights to adapt, as ``--lora_target_experts`` says (``target_parameters``)."""
    weights = expert_weight_names(blocks)
    if not blocks:
        return set()
    if config.target_parameters is None:  # auto: as the linear layers
        if isinstance(config.target_modules, str):
            return set(weights)
        return {w for t in config.target_modules for w in _expert_names(weights, t)}
    unknown = [name for name in config.target_parameters if not _expert_names(weights, name)]
    if unknown:
        raise UserError(
            f"--lora_target_experts {','.join(config.target_parameters)}: {', '.join(unknown)} names no expert "
            f"weight; the model's expert weights are {', '.join(weights)} (or use auto or none)"
        )
    return {w for name in config.target_parameters for w in _expert_names(weights, name)}


def _expert_names(weights: list[str], target: str) -> list[str]:
    """The expert weights ``target`` names: its own name, or a layer a fused weight holds (``gate_proj``)."""
    leaf = target.rsplit(".", 1)[-1]
    return [w for w in weights if leaf == w or leaf in _FUSED_PARTS.get(w, ())]


def _named(names, target: str) -> bool:
    return any(name == target or name.endswith(f".{target}") for name in names)


def _layers_outside_experts(
    model: torch.nn.Module, blocks: list[MoeBlock], vision: VisionTraining
) -> dict[str, torch.nn.Module]:
    """The layers LoRA can adapt outside the routed experts, in the parts of a vision-language model ``vision`` lets
    LoRA adapt."""
    experts = tuple(block.experts + "." for block in blocks)
    in_scope = lora_scope(model, vision)
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, LORA_LAYER_TYPES) and not name.startswith(experts) and in_scope(name)
    }


def _refuse_outside_scope(model: torch.nn.Module, targets, unknown: list[str]) -> None:
    """A named target that matches layers of a vision part left without LoRA only, refused naming that part's flag
    (PEFT would have put the adapter there by the name's suffix)."""
    parts = vision_parts(model)
    if parts is None:
        return
    layers = [name for name, module in model.named_modules() if isinstance(module, LORA_LAYER_TYPES)]
    for target in unknown:
        held = sorted({parts.part_of(name) for name in layers if _named([name], target)} - {None})
        if held:
            flags = " and ".join(f"--train_{'vision_tower' if part == TOWER else 'projector'} lora" for part in held)
            raise UserError(
                f"--lora_target_modules {','.join(sorted(targets))}: {target} names layers of the {' and '.join(held)} "
                f"only, which train without LoRA unless asked; drop it, or pass {flags} to adapt them"
            )


def _refuse_bare_lora_parts(model: torch.nn.Module, modules: list[str], targets, vision: VisionTraining) -> None:
    """A vision part set to lora that the targets give no adapter, refused (it would train nothing there)."""
    parts = vision_parts(model)
    chosen = {TOWER: ("--train_vision_tower", vision.tower), PROJECTOR: ("--train_projector", vision.projector)}
    for part, (flag, mode) in chosen.items():
        if parts is None or mode != "lora" or any(parts.part_of(name) == part for name in modules):
            continue
        layers = {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, LORA_LAYER_TYPES) and parts.part_of(name) == part
        }
        if not layers:
            raise UserError(f"{flag} lora: the {part} of this model has no layer LoRA can adapt; use {flag} full")
        named = targets if isinstance(targets, str) else ",".join(sorted(targets))
        raise UserError(
            f"{flag} lora: --lora_target_modules {named} names no layer of the {part} (its layers: "
            f"{', '.join(sorted(layers))}); add some of them, or use all-linear"
        )


def _all_linear(model: torch.nn.Module, layers: dict[str, torch.nn.Module], blocks: list[MoeBlock]) -> list[str]:
    """PEFT's all-linear (every Linear and Conv1D but the output head) without the routers and gates."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    routers = tuple(router + "." for block in blocks for router in block.routers)
    return [
        name
        for name, module in layers.items()
        if isinstance(module, (torch.nn.Linear, Conv1D)) and module is not head and not (name + ".").startswith(routers)
    ]


def _router_weights(
    model: torch.nn.Module, blocks: list[MoeBlock], layers: dict[str, torch.nn.Module]
) -> dict[str, str]:
    """Router -> its weight, for the routers that are no LoRA layer type but hold their 2-D weight themselves (most
    families' TopKRouter): PEFT adapts those through target_parameters when named."""
    weights = {}
    for router in (router for block in blocks for router in block.routers if router not in layers):
        weight = getattr(model.get_submodule(router), "weight", None)
        if isinstance(weight, torch.nn.Parameter) and len(getattr(weight, "ds_shape", weight.shape)) == 2:
            weights[router] = f"{router}.weight"
    return weights


def _refuse_unknown(targets, unknown: list[str], choices: set[str], experts: str) -> None:
    raise UserError(
        f"--lora_target_modules {','.join(sorted(targets))}: {', '.join(sorted(unknown))} matches no layer LoRA can "
        f"adapt; the model's linear and embedding modules{experts} are {', '.join(sorted(choices))} "
        "(or use 'all-linear')"
    )

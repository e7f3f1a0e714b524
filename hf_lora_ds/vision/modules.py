"""A vision-language model's three parts, found by what the model is made of rather than by module names: the
language model (transformers' ``get_decoder()``), the vision tower (``get_encoder(modality="image")``) and the
projector (the multimodal model's other children, and the projector layers a tower holds itself, as the family's
facts name them: Qwen-VL's ``merger``, Qwen3-VL's deepstack mergers; hf_lora_ds.vision.families).

Names alone mislead: SigLIP, InternViT and Qwen-VL towers have their own ``q_proj``/``k_proj``/``proj``/``fc1``
layers, so PEFT's suffix matching puts ``q_proj,v_proj`` or ``all-linear`` adapters into the tower (LLaVA#1380,
ms-swift#2640); here every module is placed by the part that holds it, and the LoRA targets become exact names
inside the parts that train (hf_lora_ds.model.lora_targets).

A frozen tower still builds an autograd graph when something upstream asks for gradients: transformers'
``enable_input_require_grads`` (run for gradient checkpointing and by PEFT) hooks every sub-model's input
embeddings, the tower's patch embedding included, so each tower block saves its activations (and, under gradient
checkpointing, runs again in the backward) for a gradient nothing reads (ms-swift PR #10214). The layers of a frozen
tower therefore run under ``torch.no_grad`` (``run_frozen_tower_without_graph``): the whole tower where the projector
is beside it, Qwen-VL's patch embedding and blocks one by one, so that the merger inside the tower, and the tower's
own code after it, still carry the gradient to a trained projector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from peft import PeftModel
from transformers import (
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    PretrainedConfig,
    PreTrainedModel,
)

from hf_lora_ds.config.vision import VisionMode, VisionTraining
from hf_lora_ds.errors import UserError
from hf_lora_ds.vision.families import family_of

__all__ = [
    "LANGUAGE_MODEL",
    "PROJECTOR",
    "TOWER",
    "VisionParts",
    "full_training_modules",
    "lora_parts",
    "lora_scope",
    "run_frozen_tower_without_graph",
    "vision_model_class",
    "vision_parts",
]

LANGUAGE_MODEL, TOWER, PROJECTOR = "language model", "vision tower", "projector"
_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict)
_GRAPHLESS = "_hf_lora_ds_runs_without_graph"  # set on a tower once its no-grad hooks are in


@dataclass(frozen=True)
class VisionParts:
    """The parts' module names, as ``named_modules()`` of the model they were found in spells them."""

    language_model: str
    tower: str
    projectors: tuple[str, ...]

    def part_of(self, name: str) -> str | None:
        """The part holding the module or parameter ``name``: a projector inside the tower is the projector's; None
        for what is in no part (the output head, the model's own root)."""
        if any(_within(name, projector) for projector in self.projectors):
            return PROJECTOR
        if _within(name, self.tower):
            return TOWER
        if _within(name, self.language_model):
            return LANGUAGE_MODEL
        return None


def vision_parts(model: torch.nn.Module) -> VisionParts | None:
    """The parts of a vision-language ``model`` (PEFT-wrapped or not); None for a text-only model."""
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    if not isinstance(base, PreTrainedModel):
        return None
    tower = base.get_encoder(modality="image")
    if tower is base or tower is base.base_model:  # transformers' answer for a model without an image encoder
        return None
    language_model = base.get_decoder()
    names = {id(module): name for name, module in model.named_modules(remove_duplicate=False)}
    holder = next((module for module in model.modules() if language_model in module.children()), None)
    if holder is None or id(tower) not in names:
        raise UserError(
            f"{type(base).__name__}: cannot tell its language model from its vision tower (the language model is "
            "not a sub-module beside the tower); this vision-language family is not supported yet"
        )
    beside = [child for child in holder.children() if child is not language_model and child is not tower]
    family = family_of(base)
    named = [holder.get_submodule(path) for path in (family.projector if family else ())]
    projectors = [*beside, *(module for module in named if all(module is not other for other in beside))]
    return VisionParts(
        language_model=names[id(language_model)],
        tower=names[id(tower)],
        projectors=tuple(names[id(module)] for module in projectors),
    )


def lora_parts(training: VisionTraining) -> set[str]:
    """The vision-language parts LoRA may adapt: the language model always, the tower and the projector when set to
    ``lora``."""
    chosen = {TOWER: training.tower, PROJECTOR: training.projector}
    return {LANGUAGE_MODEL, *(part for part, mode in chosen.items() if mode == "lora")}


def lora_scope(model: torch.nn.Module, training: VisionTraining) -> Callable[[str], bool]:
    """Whether LoRA may adapt the module ``name`` of ``model``: in ``lora_parts``, or in no part (the output head,
    which only a target naming it reaches); any module of a text-only model."""
    parts = vision_parts(model)
    if parts is None:
        return lambda name: True
    allowed = lora_parts(training) | {None}
    return lambda name: parts.part_of(name) in allowed


def full_training_modules(model: torch.nn.Module, training: VisionTraining) -> list[str]:
    """The modules PEFT must train in full and save with the adapter (its ``modules_to_save``) for the parts set to
    ``full``: the largest modules that hold weights of that part only (Qwen-VL's tower holds its projector, so its
    own children are named instead of the tower), entering a ModuleList, whose modules are called one by one."""
    parts = vision_parts(model)
    chosen: dict[str, VisionMode] = {TOWER: training.tower, PROJECTOR: training.projector}
    if parts is None or "full" not in chosen.values():
        return []
    roots = {TOWER: [parts.tower], PROJECTOR: list(parts.projectors)}
    modules = [
        name
        for part, mode in chosen.items()
        if mode == "full"
        for root in roots[part]
        for name in _whole_modules(model, root, part, parts)
    ]
    covered = tuple(f"{name}." for name in modules)
    missed = [
        name
        for name, _ in model.named_parameters()
        if chosen.get(parts.part_of(name)) == "full" and not name.startswith(covered)
    ]
    if missed:
        raise UserError(
            f"--train_vision_tower/--train_projector full: {', '.join(missed[:3])} belong to no module that can be "
            "trained in full apart from the other parts; use lora for that part"
        )
    return modules


def run_frozen_tower_without_graph(model: torch.nn.Module) -> None:
    """Run the layers of the vision tower of ``model`` under ``torch.no_grad`` when none of its own weights train (see
    the module docstring): each largest module that holds tower weights only. Once per tower; nothing for a
    text-only model."""
    parts = vision_parts(model)
    if parts is None:
        return
    tower = model.get_submodule(parts.tower)
    if getattr(tower, _GRAPHLESS, False):
        return
    if any(param.requires_grad for name, param in model.named_parameters() if parts.part_of(name) == TOWER):
        return
    for name in _whole_modules(model, parts.tower, TOWER, parts):
        _run_without_grad(model.get_submodule(name))
    setattr(tower, _GRAPHLESS, True)


def auto_model_class(config: PretrainedConfig) -> type:
    """The auto class a checkpoint of ``config`` loads with: image-text-to-text for a vision-language model (its
    tower included), causal LM for a text model."""
    return AutoModelForImageTextToText if vision_model_class(config) else AutoModelForCausalLM


def vision_model_class(config: PretrainedConfig) -> type[PreTrainedModel] | None:
    """The class that loads a vision-language checkpoint with its tower (transformers' image-text-to-text class); None
    for a text-only config, which loads as a causal LM."""
    if getattr(config, "vision_config", None) is None:
        return None
    return MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING.get(type(config), None)


def _within(name: str, root: str) -> bool:
    return name == root or name.startswith(root + ".")


def _whole_modules(model: torch.nn.Module, root: str, part: str, parts: VisionParts) -> list[str]:
    """``root`` when every module under it is of ``part`` and it is called as a whole, else the same for each of its
    children of ``part``."""
    module = model.get_submodule(root)
    inside = (f"{root}.{name}" for name, _ in module.named_modules() if name)
    if not isinstance(module, _CONTAINERS) and all(parts.part_of(name) == part for name in inside):
        return [root]
    children = [f"{root}.{name}" for name, child in module.named_children() if _has_weights(child)]
    return [
        whole
        for child in children
        if parts.part_of(child) == part
        for whole in _whole_modules(model, child, part, parts)
    ]


def _has_weights(module: torch.nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _run_without_grad(module: torch.nn.Module) -> None:
    """Hooks that switch gradients off for ``module``'s forward and restore the caller's mode after it, also when the
    forward raises."""
    outer: list[bool] = []

    def enter(_module: torch.nn.Module, _args: tuple) -> None:
        outer.append(torch.is_grad_enabled())
        torch.set_grad_enabled(False)

    def leave(_module: torch.nn.Module, _args: tuple, _output: object) -> None:
        torch.set_grad_enabled(outer.pop())

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave, always_call=True)

"""From arguments to a PEFT LoRA model, and the trainable-parameter report users check first."""

from __future__ import annotations

import dataclasses
import os
import warnings

import torch
from peft import EvaConfig, LoraConfig, PeftModel, TaskType, get_peft_model
from peft.tuners.lora.config import CordaConfig

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.lora_init import DataPass
from hf_lora_ds.config.vision import FROZEN_VISION, VisionTraining
from hf_lora_ds.model.lora_targets import (
    add_dropout,
    check_target_modules,
    expert_fields,
    parse_targets,
    peft_keeps_exact_targets,
    resolve_targets,
)
from hf_lora_ds.vision.modules import run_frozen_tower_without_graph

__all__ = [
    "lora_config_from_args",
    "shape_config",
    "wrap_with_lora",
    "load_adapter",
    "check_target_modules",
    "trainable_parameters_line",
    "targets_text",
    "parse_targets",
]


def lora_config_from_args(args: SFTTrainingArguments) -> LoraConfig:
    """``args`` built or ``unbuilt`` (the planner, the audit). ``all-linear`` is PEFT's own shorthand (every linear
    layer but the output head), passed through unchanged; the experts' flags are PEFT's fields too
    (hf_lora_ds.model.lora_targets)."""
    init = args.lora_start
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=parse_targets(args.lora_target_modules),
        use_rslora=args.use_rslora,
        use_dora=args.use_dora,
        init_lora_weights=init.peft_value,
        # EVA and CorDA read the layers' inputs before step 1 (hf_lora_ds.training.lora_init); CorDA in its
        # instruction-previewed mode, the one meant for fast convergence on the task.
        eva_config=EvaConfig() if init.data_pass is DataPass.EVA else None,
        corda_config=CordaConfig(corda_method="ipm") if init.data_pass is DataPass.CORDA else None,
        **expert_fields(args),
    )


def shape_config(config: LoraConfig) -> LoraConfig:
    """The same adapter shapes with PEFT's default initialisation: for models built on the meta device (the planner,
    the audit, the adapter check), where an SVD of the base weights or a data pass has nothing to read."""
    return dataclasses.replace(config, init_lora_weights=True, eva_config=None, corda_config=None)


def wrap_with_lora(model: torch.nn.Module, config: LoraConfig, vision: VisionTraining = FROZEN_VISION) -> PeftModel:
    """Wrap ``model`` unless it already is a PeftModel (a resumed or user-built adapter is kept as it is). On a MoE or
    vision-language model the targets are resolved to exact names first (the vision parts as ``vision`` says), and
    the dropout put where PEFT takes it (hf_lora_ds.model.lora_targets); ``config`` keeps the flags' words. A vision
    tower none of whose weights train runs without an autograd graph (hf_lora_ds.vision.modules)."""
    if isinstance(model, PeftModel):
        run_frozen_tower_without_graph(model)
        return model
    resolved = resolve_targets(model, config, vision)
    with peft_keeps_exact_targets(), warnings.catch_warnings():
        if resolved.target_parameters:  # PEFT matches the patterns against target_modules only, and would warn
            warnings.filterwarnings("ignore", "The following (rank|alpha)_pattern keys did not match", RuntimeWarning)
        wrapped = get_peft_model(model, resolved)
    if resolved.lora_dropout != config.lora_dropout:
        add_dropout(wrapped, config.lora_dropout)
    run_frozen_tower_without_graph(wrapped)
    return wrapped


def load_adapter(model: torch.nn.Module, adapter: str | os.PathLike) -> PeftModel:
    """PEFT's ``from_pretrained`` of a saved adapter, with the exact targets a MoE adapter was saved with kept
    (hf_lora_ds.model.lora_targets: PEFT 0.21 would rewrite them and fail to load DeepSeek-V3's)."""
    with peft_keeps_exact_targets():
        return PeftModel.from_pretrained(model, str(adapter))


def trainable_parameters_line(model: PeftModel) -> str:
    """PEFT's count, which also sees ZeRO-3 partitioned parameters (their local numel is 0)."""
    trainable, total = model.get_nb_trainable_parameters()
    return f"trainable params: {trainable:,} || all params: {total:,} || trainable%: {100 * trainable / total:.4f}"


def targets_text(config: LoraConfig) -> str:
    """The config's target modules as the flag writes them (``all-linear`` or ``q_proj,v_proj``)."""
    targets = config.target_modules
    return targets if isinstance(targets, str) else ",".join(sorted(targets or []))

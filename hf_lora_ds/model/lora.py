"""From arguments to a PEFT LoRA model, and the trainable-parameter report users check first."""

from __future__ import annotations

import dataclasses

import torch
from peft import EvaConfig, LoraConfig, PeftModel, TaskType, get_peft_model
from peft.tuners.lora.config import CordaConfig
from transformers.pytorch_utils import Conv1D

from hf_lora_ds.config import RunValues
from hf_lora_ds.config.lora_init import DataPass, parse_lora_init
from hf_lora_ds.errors import UserError

__all__ = [
    "lora_config_from_args",
    "shape_config",
    "wrap_with_lora",
    "check_target_modules",
    "trainable_parameters_line",
    "targets_text",
    "parse_targets",
]

# Layer types PEFT's LoRA can adapt (bitsandbytes' 4/8-bit linears are nn.Linear subclasses).
LORA_LAYER_TYPES = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, Conv1D)


def lora_config_from_args(args: RunValues) -> LoraConfig:
    """``args``: SFTTrainingArguments, or the same fields parsed without building one (the planner, the CLI).
    ``all-linear`` is PEFT's own shorthand (every linear layer but the output head), passed through unchanged."""
    init = parse_lora_init(getattr(args, "lora_init", "default"))
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
    )


def shape_config(config: LoraConfig) -> LoraConfig:
    """The same adapter shapes with PEFT's default initialisation: for models built on the meta device (the planner,
    the audit, the adapter check), where an SVD of the base weights or a data pass has nothing to read."""
    return dataclasses.replace(config, init_lora_weights=True, eva_config=None, corda_config=None)


def parse_targets(text: str) -> str | list[str]:
    """``--lora_target_modules`` as PEFT takes it: ``all-linear`` as it is, else the list of names."""
    targets = text.strip()
    return targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]


def wrap_with_lora(model: torch.nn.Module, config: LoraConfig) -> PeftModel:
    """Wrap ``model`` unless it already is a PeftModel (a resumed or user-built adapter is kept as it is)."""
    if isinstance(model, PeftModel):
        return model
    check_target_modules(model, config)
    return get_peft_model(model, config)


def check_target_modules(model: torch.nn.Module, config: LoraConfig) -> None:
    """Every name in ``--lora_target_modules`` must name a layer LoRA can adapt (PEFT's rule: the module's full name
    or its last dotted parts). PEFT itself raises a traceback only when no name matches at all, and trains the
    others silently when one of several is a typo."""
    if isinstance(config.target_modules, str):  # "all-linear"
        return
    adaptable = [name for name, module in model.named_modules() if isinstance(module, LORA_LAYER_TYPES)]
    unknown = sorted(
        target
        for target in config.target_modules
        if not any(name == target or name.endswith(f".{target}") for name in adaptable)
    )
    if unknown:
        choices = ", ".join(sorted({name.rsplit(".", 1)[-1] for name in adaptable}))
        raise UserError(
            f"--lora_target_modules {','.join(sorted(config.target_modules))}: {', '.join(unknown)} "
            f"matches no layer LoRA can adapt; the model's linear and embedding modules are {choices} "
            "(or use 'all-linear')"
        )


def trainable_parameters_line(model: PeftModel) -> str:
    """PEFT's count, which also sees ZeRO-3 partitioned parameters (their local numel is 0)."""
    trainable, total = model.get_nb_trainable_parameters()
    return f"trainable params: {trainable:,} || all params: {total:,} || trainable%: {100 * trainable / total:.4f}"


def targets_text(config: LoraConfig) -> str:
    """The config's target modules as the flag writes them (``all-linear`` or ``q_proj,v_proj``)."""
    targets = config.target_modules
    return targets if isinstance(targets, str) else ",".join(sorted(targets or []))

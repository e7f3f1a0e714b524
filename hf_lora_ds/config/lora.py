"""The LoRA fields (rank, scaling, targets, initialisation, optimizer) and the checks of their values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from hf_lora_ds.errors import UserError

if TYPE_CHECKING:
    from hf_lora_ds.config.arguments import SFTTrainingArguments  # these checks read across the parts

__all__ = ["LoraArguments", "check_lora_fields"]


@dataclass
class LoraArguments:
    """The adapter: its shape, where it goes, how it starts and how it is optimised."""

    lora_rank: int = field(default=8, metadata={"help": "LoRA rank r."})
    lora_alpha: float = field(
        default=16, metadata={"help": "LoRA scaling numerator (scale = alpha / r, or / sqrt(r))."}
    )
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input, in [0, 1)."})
    lora_target_modules: str = field(
        default="all-linear",
        metadata={
            "help": "Comma-separated module names to adapt, or 'all-linear' for every linear layer but the head."
        },
    )
    lora_target_experts: str = field(
        default="auto",
        metadata={
            "help": "Mixture-of-Experts models: which routed-expert weights get LoRA. auto: as the linear layers "
            "(every expert weight under all-linear, else those --lora_target_modules names: gate_proj/up_proj name "
            "a fused gate_up_proj, as do Mixtral's w1/w3); none; or comma-separated expert weight names "
            "(gate_up_proj,down_proj; w1,w2,w3 for per-expert layers). Fused 3-D weights go through PEFT's "
            "target_parameters. Shared experts follow --lora_target_modules; the router never gets LoRA unless named."
        },
    )
    lora_expert_rank: int | None = field(
        default=None,
        metadata={
            "help": "LoRA rank of the expert weights (PEFT's rank_pattern), with the other adapters' scaling: "
            "each expert has its own r x (in + out) adapter, so experts hold most of a MoE adapter. "
            "Default: --lora_rank."
        },
    )
    lora_allow_partial: bool = field(
        default=False,
        metadata={
            "help": "Train even when the LoRA targets leave whole decoder layers, or the experts most layers have, "
            "without an adapter (the coverage table printed at start shows where the adapters are)."
        },
    )
    use_rslora: bool = field(default=False, metadata={"help": "Rank-stabilised LoRA: scale by alpha / sqrt(r)."})
    use_dora: bool = field(default=False, metadata={"help": "Weight-decomposed LoRA (DoRA)."})
    lora_init: str = field(
        default="default",
        metadata={
            "help": "How the adapter starts (PEFT's init_lora_weights; trade-offs in hf_lora_ds.model.lora_variants "
            "and docs/lora.md): default (B zero: the base exactly), gaussian, pissa / pissa_niter_N (top singular "
            "vectors of each weight; the base keeps the residual), olora (QR of each weight), eva (SVD of each "
            "layer's inputs over --lora_init_samples training samples; ranks redistributed), corda (SVD weighted "
            "by those inputs' covariance), loftq (--load_in_4bit only: fits the 4-bit quantisation error), "
            "orthogonal (even rank). pissa/olora/corda rewrite the base to its residual: their adapter is saved "
            "converted to plain LoRA of twice the rank for the original base."
        },
    )
    lora_init_samples: int = field(
        default=256,
        metadata={
            "help": "Training samples EVA and CorDA run through the base before step 1 (the same ones on every "
            "rank, so the start does not depend on the rank count). More: a steadier start, a longer pass."
        },
    )
    lora_optimizer: Literal["adamw", "loraplus", "lorafa"] = field(
        default="adamw",
        metadata={
            "help": "adamw: Trainer's optimizer (--optim). loraplus: the same optimizer with B at "
            "--loraplus_lr_ratio x the learning rate of A (LoRA+, peft.optimizers). lorafa: A frozen at its init, "
            "B's gradient projected (LoRA-FA, its own AdamW): no gradients or Adam moments for A; one process, "
            "DDP or ZeRO-0 only."
        },
    )
    loraplus_lr_ratio: float | None = field(
        default=None,
        metadata={"help": "LoRA+: learning rate of B over that of A (>= 1; default 16, the LoRA+ paper's choice)."},
    )


def check_lora_fields(args: SFTTrainingArguments) -> None:
    """LoRA's numbers in range and some target named, before PEFT fails on them with a traceback."""
    if args.lora_rank < 1:
        raise UserError(f"--lora_rank must be a positive integer, got {args.lora_rank}")
    if args.lora_alpha <= 0:
        raise UserError(f"--lora_alpha must be positive, got {args.lora_alpha}")
    if not 0 <= args.lora_dropout < 1:
        raise UserError(f"--lora_dropout must be in [0, 1), got {args.lora_dropout}")
    if not args.lora_target_modules.strip(" ,"):
        raise UserError("--lora_target_modules is empty; use 'all-linear' or names such as 'q_proj,v_proj'")
    if not args.lora_target_experts.strip(" ,"):
        raise UserError("--lora_target_experts is empty; use auto, none or names such as 'gate_up_proj,down_proj'")
    if args.lora_expert_rank is not None and args.lora_expert_rank < 1:
        raise UserError(f"--lora_expert_rank must be a positive integer, got {args.lora_expert_rank}")

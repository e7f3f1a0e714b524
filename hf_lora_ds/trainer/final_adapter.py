"""The adapter a finished run leaves in ``output_dir``: made plain LoRA for the original base (converted from its
start where that was not zero: hf_lora_ds.model.adapter_conversion) and refused if it never trained, against the
highest learning rate the trainer's own optimizer steps applied (hf_lora_ds.model.adapter_check)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_lora_ds.distributed import gather_from_ranks
from hf_lora_ds.model.adapter_check import UntrainedAdapterError, check_adapter_trained, verify_adapter
from hf_lora_ds.model.adapter_conversion import write_plain_adapter

if TYPE_CHECKING:
    from hf_lora_ds.trainer.lora_sft_trainer import LoraSFTTrainer

__all__ = ["finish_final_adapter"]


def finish_final_adapter(trainer: LoraSFTTrainer) -> None:
    """Rank 0 converts the saved adapter and checks that it trained; every rank raises the same error, so no rank is
    left in a collective."""
    problem = None
    if trainer.args.should_save:
        try:
            _convert_and_check(trainer, trainer.args.output_dir, trainer.state.global_step, trainer.max_learning_rate)
        except UntrainedAdapterError as error:
            problem = str(error)
    problem = gather_from_ranks(problem)[0]
    if problem:
        raise UntrainedAdapterError(problem)


def _convert_and_check(trainer: LoraSFTTrainer, output_dir: str, steps: int, top_rate: float) -> None:
    if trainer.adapter_start is not None or trainer.variant_line:
        moved = write_plain_adapter(output_dir, trainer.adapter_start)
        verify_adapter(output_dir, base_model=trainer.model.get_base_model().config)
        if not moved and steps and top_rate > 0:
            raise UntrainedAdapterError(
                f"The adapter saved in {output_dir} never trained: "
                f"every tensor still holds its start after {steps} steps"
            )
    check_adapter_trained(output_dir, steps, top_rate)

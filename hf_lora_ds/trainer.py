"""``LoraSFTTrainer``: transformers' Trainer with a LoRA model, the mask audit up front, every saved adapter
checked (the final one is always saved), and ``resume_from_checkpoint="auto"`` that skips checkpoints a kill cut short.

Everything else (DeepSpeed, DDP, mixed precision, checkpoints, logging to ``report_to``) is Trainer's own.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch
from peft import LoraConfig
from transformers import Trainer

from hf_lora_ds.adapter import verify_adapter
from hf_lora_ds.arguments import SFTTrainingArguments
from hf_lora_ds.audit import audit_dataset
from hf_lora_ds.callbacks import MemoryTraceCallback, use_swanlab
from hf_lora_ds.data import ChatSFTDataset
from hf_lora_ds.lora import lora_config_from_args, trainable_parameters_line, wrap_with_lora
from hf_lora_ds.nonfinite import stop_on_nonfinite_loss
from hf_lora_ds.preemption import PreemptionCallback
from hf_lora_ds.resume import CheckpointCompletionCallback, resolve_resume_checkpoint

__all__ = ["LoraSFTTrainer"]


class LoraSFTTrainer(Trainer):
    """A Trainer for LoRA SFT. Pass the base model; it is wrapped with PEFT from ``args`` (or ``lora_config``)
    unless it already is a PeftModel."""

    def __init__(
        self,
        model: torch.nn.Module,
        args: SFTTrainingArguments,
        *trainer_args: Any,
        lora_config: LoraConfig | None = None,
        **trainer_kwargs: Any,
    ):
        model = wrap_with_lora(model, lora_config or lora_config_from_args(args))
        super().__init__(model, args, *trainer_args, **trainer_kwargs)
        if "swanlab" in self.args.report_to:
            # transformers' own SwanLab callback crashes with swanlab 0.10 and needs an API key; ours runs offline.
            use_swanlab(self)
        # Marks each checkpoint once every rank has written it, for resume_from_checkpoint="auto" (hf_lora_ds.resume).
        self.add_callback(CheckpointCompletionCallback())
        # SIGTERM/SIGUSR1: finish the step, save a complete checkpoint, stop (hf_lora_ds.preemption).
        self.preemption = PreemptionCallback()
        self.add_callback(self.preemption)
        self._print_main(trainable_parameters_line(self.model))

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """Print the mask audit before training (the one look at the labels most runs never get), then save the
        adapter and tokenizer after it, so a finished run always leaves them in ``output_dir``.

        ``resume_from_checkpoint`` "auto" (or True) takes the latest checkpoint in ``output_dir`` that every rank
        finished writing, or starts fresh when there is none; Trainer's own True takes the highest-numbered one,
        complete or not. A path is used as given."""
        if resume_from_checkpoint is True or resume_from_checkpoint == "auto":
            resume_from_checkpoint, note = resolve_resume_checkpoint("auto", self.args.output_dir, self.args.world_size)
            self._print_main(note)
        if isinstance(self.train_dataset, ChatSFTDataset):
            self._print_main(audit_dataset(self.train_dataset).line())
        result = super().train(resume_from_checkpoint, *args, **kwargs)
        if self.preemption.preempted:  # the checkpoint is the run's state; a final adapter would look finished
            self._print_main(
                f"preempted (signal {self.preemption.signal_received or 'on another rank'}): saved "
                f"{self.args.output_dir}/checkpoint-{self.state.global_step}; rerun with --resume_from_checkpoint auto"
            )
            return result
        with ExitStack() as traced:
            # Trainer's events end with training, so memory tracers see this save only if it is wrapped for them.
            for tracer in self.callback_handler.callbacks:
                if isinstance(tracer, MemoryTraceCallback):
                    traced.enter_context(tracer.phase("save"))
            self.save_model()
        return result

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """Trainer's loss, checked before its backward pass: a NaN or infinite training loss stops the run with the
        step, the samples and the last complete checkpoint (hf_lora_ds.nonfinite), before any NaN gradient lands."""
        result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if model.training:
            loss = result[0] if return_outputs else result
            dataset = self.train_dataset if isinstance(self.train_dataset, ChatSFTDataset) else None
            stop_on_nonfinite_loss(loss, inputs, dataset, self.state.global_step + 1, self.args.output_dir)
        return result

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Check every adapter Trainer writes (final and checkpoints): under ZeRO-3 a missing gather saves
        zero-size tensors without any error, and the run only fails later, at merge or load time."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            verify_adapter(output_dir or self.args.output_dir, base_model=self.model.get_base_model().config)

    def _print_main(self, message: str) -> None:
        if self.is_world_process_zero():
            print(message, flush=True)

"""``LoraSFTTrainer``: transformers' Trainer with a LoRA model, the mask audit up front, every saved adapter
checked (the final one is always saved, and must have trained), and ``resume_from_checkpoint="auto"`` that skips
checkpoints a kill cut short.

Everything else (DeepSpeed, DDP, mixed precision, checkpoints, logging to ``report_to``) is Trainer's own.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch
from peft import LoraConfig
from transformers import Trainer, TrainerCallback

from hf_lora_ds.adapter import UntrainedAdapterError, check_adapter_trained, verify_adapter
from hf_lora_ds.arguments import SFTTrainingArguments
from hf_lora_ds.audit import audit_by_source, audit_dataset
from hf_lora_ds.callbacks import MemoryTraceCallback, use_swanlab
from hf_lora_ds.data import ChatSFTDataset
from hf_lora_ds.distributed import gather_from_ranks
from hf_lora_ds.lora import lora_config_from_args, trainable_parameters_line, wrap_with_lora
from hf_lora_ds.resume import CheckpointCompletionCallback, resolve_resume_checkpoint

__all__ = ["LoraSFTTrainer"]


class SourceCountsLog(TrainerCallback):
    """Puts the samples per data source into the log history as ``data/samples/<source>``, so trainer_state.json
    and the run report record what a mixture actually drew."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        entry = {f"data/samples/{name}": count for name, count in self.counts.items()}
        state.log_history.append({**entry, "step": state.global_step})


class LearningRateWatch(TrainerCallback):
    """The highest learning rate any optimizer step of this run used, read as each step begins."""

    def __init__(self) -> None:
        self.max_learning_rate = 0.0

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs) -> None:
        if optimizer is not None:
            rates = [group["lr"] for group in optimizer.param_groups]
            self.max_learning_rate = max(self.max_learning_rate, *rates)


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
        self._learning_rates = LearningRateWatch()
        self.add_callback(self._learning_rates)
        self._print_main(trainable_parameters_line(self.model))

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """Print the mask audit before training (the one look at the labels most runs never get), then save the
        adapter and tokenizer after it, so a finished run always leaves them in ``output_dir``, and raise
        ``UntrainedAdapterError`` (on every rank) if that adapter never moved from its initial state.

        ``resume_from_checkpoint`` "auto" (or True) takes the latest checkpoint in ``output_dir`` that every rank
        finished writing, or starts fresh when there is none; Trainer's own True takes the highest-numbered one,
        complete or not. A path is used as given."""
        if resume_from_checkpoint is True or resume_from_checkpoint == "auto":
            resume_from_checkpoint, note = resolve_resume_checkpoint("auto", self.args.output_dir, self.args.world_size)
            self._print_main(note)
        if isinstance(self.train_dataset, ChatSFTDataset):
            self._print_main(audit_dataset(self.train_dataset).line())
            if len(self.train_dataset.source_counts) > 1:
                for name, audit in audit_by_source(self.train_dataset).items():
                    self._print_main(f"  {name}: {audit.line()}")
            self.add_callback(SourceCountsLog(self.train_dataset.source_counts))
        result = super().train(resume_from_checkpoint, *args, **kwargs)
        with ExitStack() as traced:
            # Trainer's events end with training, so memory tracers see this save only if it is wrapped for them.
            for tracer in self.callback_handler.callbacks:
                if isinstance(tracer, MemoryTraceCallback):
                    traced.enter_context(tracer.phase("save"))
            self.save_model()
        self._check_final_adapter_trained()
        return result

    def _check_final_adapter_trained(self) -> None:
        """Rank 0 reads the saved adapter; every rank raises the same error, so no rank is left in a collective."""
        problem = None
        if self.args.should_save:
            try:
                check_adapter_trained(self.args.output_dir, self.state.global_step,
                                      self._learning_rates.max_learning_rate)  # fmt: skip
            except UntrainedAdapterError as error:
                problem = str(error)
        problem = gather_from_ranks(problem)[0]
        if problem:
            raise UntrainedAdapterError(problem)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Check every adapter Trainer writes (final and checkpoints): under ZeRO-3 a missing gather saves
        zero-size tensors without any error, and the run only fails later, at merge or load time."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            verify_adapter(output_dir or self.args.output_dir, base_model=self.model.get_base_model().config)

    def _print_main(self, message: str) -> None:
        if self.is_world_process_zero():
            print(message, flush=True)

"""``LoraSFTTrainer``: transformers' Trainer with a LoRA model, the mask audit up front, the loss from logits at the
supervised positions only (hf_lora_ds.training.supervised_logits), every saved adapter checked (the final one is always
saved, and must have trained), and ``resume_from_checkpoint="auto"`` that skips checkpoints a kill cut short.

Everything else (DeepSpeed, DDP, mixed precision, checkpoints, logging to ``report_to``) is Trainer's own.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel
from transformers import PreTrainedTokenizerBase, Trainer, TrainerCallback
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging

from hf_lora_ds._compat import deepspeed_startup_trimmed
from hf_lora_ds.callbacks.run_callbacks import attach_run_callbacks
from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.reporting import chosen_callbacks
from hf_lora_ds.data.audit import audit_by_source, audit_dataset
from hf_lora_ds.data.batches import LengthGroupedEpochSampler
from hf_lora_ds.data.batches.packing import training_samples
from hf_lora_ds.data.dataset import ChatSFTDataset
from hf_lora_ds.errors import UserError
from hf_lora_ds.eval.evaluator import EvalResult
from hf_lora_ds.model.adapter_check import verify_adapter
from hf_lora_ds.model.adapter_conversion import adapter_set_to, adapter_snapshot
from hf_lora_ds.model.lora import lora_config_from_args, targets_text, trainable_parameters_line
from hf_lora_ds.model.lora_coverage import COVERAGE_FILE, lora_coverage
from hf_lora_ds.model.lora_targets import experts_line
from hf_lora_ds.model.lora_variants import variant_line
from hf_lora_ds.trainer.answers import before_and_after
from hf_lora_ds.trainer.final_adapter import finish_final_adapter
from hf_lora_ds.trainer.run_inputs import prepare_run_inputs
from hf_lora_ds.training.adapter_inputs import inputs_as_they_come, uncast_in_training
from hf_lora_ds.training.batches import prepare_batches, with_supervised_positions
from hf_lora_ds.training.checkpoints import lost_ranks, resolve_resume_checkpoint, save_failures
from hf_lora_ds.training.compile import check_torch_compile, compiled_regions, without_whole_model_compile
from hf_lora_ds.training.fsdp2 import full_adapter_state_dict, full_grad_norm, sharded_on_cpu, shards_on_cpu
from hf_lora_ds.training.liger import check_liger, liger_patches_restored
from hf_lora_ds.training.lora_init import wrap_as_initialised
from hf_lora_ds.training.lora_optimizers import create_lora_optimizer
from hf_lora_ds.training.lora_update import one_matmul_layers, updates_in_one_matmul
from hf_lora_ds.training.loss_head import full_logits_reason as full_logits_reason_of
from hf_lora_ds.training.nonfinite import NonFiniteGuard, ends_window
from hf_lora_ds.training.preemption import Preemption
from hf_lora_ds.training.sequence_parallel import (
    deepspeed_gradient_divisor,
    index_shards,
    sequence_parallel_group,
    sequence_parallel_loss,
    supervised_tokens_in_shards,
)
from hf_lora_ds.training.supervised_logits import (
    SUPERVISED_POSITIONS,
    accepts_position_mask,
    fused_head,
    fused_loss_outputs,
    head_selects_rows,
    normalised_loss,
    supervised_cross_entropy,
    supervised_rows,
    supervised_targets,
)
from hf_lora_ds.training.universal_checkpoint import enable_universal_loading
from hf_lora_ds.training.zero3_linear import functional_linear_kept, zero3_linear_for_lora
from hf_lora_ds.vision.collator import IMAGES

__all__ = ["LoraSFTTrainer"]

logger = logging.get_logger(__name__)

_BATCHING_KWARGS = ("train_dataset", "eval_dataset", "data_collator", "processing_class")


class LoraSFTTrainer(Trainer):
    """A Trainer for LoRA SFT, handed what a user has (as TRL's ``SFTTrainer``): the base model as a hub id, a path or
    a model (wrapped with PEFT from ``args`` or ``lora_config`` unless it already is a PeftModel), and the data as
    records (a list, a ``datasets.Dataset``, a file, folder, Hub id or mixture; none: ``args.train_file`` and
    ``args.eval_file``) or already tokenized. It tokenizes with exact label masks, seeds before the adapter exists,
    packs and batches as ``args.batching`` says (hf_lora_ds.training.batches), evaluates answer accuracy where there
    are eval records (``evaluate_answers``), and resolves ``args.resume_from_checkpoint`` once
    (hf_lora_ds.trainer.run_inputs)."""

    @functional_linear_kept()  # ZeRO-3's model loading replaces F.linear process-wide (training.zero3_linear)
    def __init__(
        self,
        model: str | os.PathLike | torch.nn.Module,
        args: SFTTrainingArguments,
        *,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        callbacks: list[TrainerCallback] | None = None,
        lora_config: LoraConfig | None = None,
        **trainer_kwargs: Any,
    ):
        check_torch_compile(args)
        inputs = prepare_run_inputs(model, args, train_dataset, eval_dataset, processing_class, list(callbacks or []))
        model, self.eval_records, self.task, self.resume = inputs.model, inputs.eval_records, inputs.task, inputs.resume
        check_liger(args, model)
        trainer_kwargs.update(
            train_dataset=inputs.train_dataset,
            eval_dataset=inputs.eval_dataset,
            processing_class=inputs.processor or inputs.tokenizer,
            callbacks=inputs.callbacks,
        )
        config = lora_config or lora_config_from_args(args)
        if args.parallelism_config is not None and args.parallelism_config.sp_enabled:
            # Ulysses must wrap the kernel the model was loaded with; DeepSpeed refuses any other.
            args.parallelism_config.sp_handler.sp_attn_implementation = model.config._attn_implementation
        wrapping = not isinstance(model, PeftModel)
        # --batching packed and the collator, before the data pass of EVA and CorDA reads the batches.
        batches = prepare_batches(args, model, *(trainer_kwargs.get(name) for name in _BATCHING_KWARGS))
        trainer_kwargs.update({name: value for name, value in zip(_BATCHING_KWARGS, batches) if value is not None})
        # PiSSA/OLoRA/CorDA/EVA/LoftQ start from the base weights or from data (hf_lora_ds.training.lora_init).
        train_dataset, _eval_dataset, data_collator = batches
        model = wrap_as_initialised(model, config, args, train_dataset, data_collator)
        # Where PEFT rewrote the base to its residual, the adapter's start is kept (on the CPU), to convert the saved
        # adapter into a plain one for the original base at the end and to put that base back for the "before" eval
        # (hf_lora_ds.model.adapter_conversion).
        rewrites_base = wrapping and args.lora_start.rewrites_base
        self.adapter_start = adapter_snapshot(model) if rewrites_base else None
        # Where the adapters landed, before any engine is built: partial targets stop here (model.lora_coverage).
        self.lora_coverage = lora_coverage(model)
        self.variant_line = variant_line(model.peft_config[model.active_adapter], args if wrapping else None)
        self.lora_lines = [line for line in (self.variant_line, experts_line(model, config.lora_dropout)) if line]
        logger.info("\n".join([self.lora_coverage.table(), *self.lora_lines]))
        experts_off = config.target_parameters == []  # --lora_target_experts none: left out on purpose
        coverage_note = self.lora_coverage.check(args.lora_allow_partial, targets_text(config), experts_off)
        trainer_kwargs["data_collator"] = with_supervised_positions(args, train_dataset, data_collator)
        super().__init__(model, args, **trainer_kwargs)
        if coverage_note:
            logger.info(coverage_note)
        # Metrics, accuracy and the report, in their order, after the caller's (hf_lora_ds.callbacks.run_callbacks).
        attach_run_callbacks(self, inputs.made)
        # What decides the run is the trainer's own: the adapter check's highest learning rate, preemption.
        self.max_learning_rate = 0.0
        self.preemption = Preemption() if "preemption" in chosen_callbacks(args.run_callbacks) else None
        on_accelerator = self.args.device.type != "cpu"
        self._uncast_lora_layers = uncast_in_training(self.model, self.accelerator.native_amp, on_accelerator)
        self.one_matmul_layers = one_matmul_layers(self.model, partitioned=self.args.engine.zero.stage == 3)
        logger.info(trainable_parameters_line(self.model))
        # Models that take a boolean logits_to_keep pass the head's rows on flattened: the head can pick them itself.
        self._position_mask = accepts_position_mask(self.model)
        full_logits_reason = full_logits_reason_of(self)
        self.supervised_logits_only = full_logits_reason is None
        self._fused_head_loss: bool | None = None  # None until a forward shows the model returns the head's loss as is
        self.supervised_in_forward: int | None = None  # the supervised tokens of the forward under way, if known
        if self.args.supervised_logits_only and full_logits_reason:
            logger.info(f"supervised-position logits: off, {full_logits_reason}; the loss uses full logits")
        self._logits_for_metrics = False
        self.sequence_parallel = self.args.engine.sequence_parallel
        if self.sequence_parallel > 1:
            if full_logits_reason:  # the libraries' SP loss would scale gradients by the SP size (DeepSpeed #5248)
                raise UserError(
                    f"--sequence_parallel_size {self.sequence_parallel} needs hf_lora_ds's "
                    f"supervised-position loss, and {full_logits_reason}"
                )
            self.loss_is_scaled_for_ga = True  # normalised over the accumulated batch's trained tokens
            self._deepspeed_divisor = deepspeed_gradient_divisor(
                self.args.engine.deepspeed_config or {}, self.accelerator.num_processes, self.sequence_parallel
            )
        samples = training_samples(self.train_dataset)
        dataset = samples if isinstance(samples, ChatSFTDataset) else None
        # NaN/inf losses and gradient norms stop the run or drop the step (hf_lora_ds.training.nonfinite).
        self.nonfinite = NonFiniteGuard(self.args.on_nonfinite, self.args.output_dir, dataset)

    def create_accelerator_and_postprocess(self) -> None:
        """Trainer's accelerator; FSDP2 kept on a CPU-only multi-process launch, where accelerate drops the plugin
        and would train plain DDP silently: ``train()`` gives it back (hf_lora_ds.training.fsdp2.sharded_on_cpu)."""
        super().create_accelerator_and_postprocess()
        self.fsdp_on_cpu = shards_on_cpu(self)
        self.is_fsdp_enabled = self.is_fsdp_enabled or self.fsdp_on_cpu

    def _build_accelerator_args(self, **kwargs: Any) -> dict[str, Any]:
        """--torch_compile compiles the decoder layers in place during ``train()`` (hf_lora_ds.training.compile), not
        the whole model through accelerate."""
        return without_whole_model_compile(super()._build_accelerator_args(**kwargs))

    def _set_signature_columns_if_needed(self) -> None:
        """The forward's arguments and the samples' images, which Trainer would drop before the collator's pixels."""
        super()._set_signature_columns_if_needed()
        self._signature_columns = list(dict.fromkeys([*self._signature_columns, IMAGES]))

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """Print the mask audit before training, then save the adapter and tokenizer after it (a finished run always
        leaves them in ``output_dir``), and raise ``UntrainedAdapterError`` (on every rank) if that adapter never moved.

        Resumes where ``args.resume_from_checkpoint`` says (resolved before the model loaded); one given here: "auto"
        (or True) takes the latest checkpoint in ``output_dir`` every rank finished writing, or starts fresh without
        one (Trainer's True takes the highest-numbered, complete or not); a path as given. A ZeRO checkpoint of another
        number of ranks is converted to a universal one (hf_lora_ds.training.universal_checkpoint) or refused."""
        deepspeed_config = self.args.engine.deepspeed_config  # the live dict the engine will be built from
        resume = self.resume
        if resume_from_checkpoint:
            value = "auto" if resume_from_checkpoint is True else resume_from_checkpoint
            resume = resolve_resume_checkpoint(value, self.args.output_dir, self.args.world_size, deepspeed_config)
            if resume.note:
                logger.info(resume.note)
        if resume.repartitioned:  # ZeRO partitions of another rank count (hf_lora_ds.training.universal_checkpoint)
            universal = enable_universal_loading(resume.checkpoint, deepspeed_config, self.is_world_process_zero())
            logger.info(f"resume: loading the DeepSpeed universal checkpoint {universal}")
        if self.is_world_process_zero():  # for the run report
            Path(self.args.output_dir).mkdir(parents=True, exist_ok=True)
            lines = [self.lora_coverage.table(), *self.lora_lines]
            (Path(self.args.output_dir) / COVERAGE_FILE).write_text("\n".join(lines) + "\n")
        samples = training_samples(self.train_dataset)  # packed rows: the samples in them
        if isinstance(samples, ChatSFTDataset):
            logger.info(audit_dataset(samples).line())
            if len(samples.source_counts) > 1:
                for name, audit in audit_by_source(samples).items():
                    logger.info(f"  {name}: {audit.line()}")
        # What the run changes in other libraries is changed for it only: the engine, its ZeRO optimizer (and ZeRO-3's
        # F.linear) and accelerate's FSDP state are made inside train().
        trimmed = deepspeed_startup_trimmed() if self.is_deepspeed_enabled else nullcontext()
        sharded = sharded_on_cpu(self) if self.fsdp_on_cpu else nullcontext()
        signals = self.preemption.handling_signals() if self.preemption else nullcontext()
        liger = liger_patches_restored() if self.args.use_liger_kernel else nullcontext()
        compiled = compiled_regions(self.model, self.args) if self.args.torch_compile else nullcontext()
        try:  # lost_ranks: a rank killed in a save is one line
            with signals, lost_ranks(self.args.output_dir), trimmed, sharded, liger, compiled, functional_linear_kept():
                result = super().train(resume.checkpoint, *args, **kwargs)
            if self.preempted:  # the checkpoint is the run's state; a final adapter would look finished
                signal_number, checkpoint = self.preemption.signal_received, f"checkpoint-{self.state.global_step}"
                logger.info(
                    f"preempted (signal {signal_number or 'on another rank'}): saved {self.args.output_dir}/"
                    f"{checkpoint}; rerun with --resume_from_checkpoint auto"
                )
                return result
            self._announce("on_final_save_begin")  # after Trainer's last event: callbacks learn of this save only so
            self.save_model()
            self._announce("on_final_save_end")
        except BaseException:
            self._announce("on_train_failed")  # no on_train_end comes: callbacks close what they opened
            raise
        finish_final_adapter(self)
        return result

    @property
    def preempted(self) -> bool:
        """Whether a preemption signal stopped training: the run's state is its last checkpoint, no final adapter."""
        return self.preemption is not None and self.preemption.preempted

    def _announce(self, event: str) -> None:
        """One of this trainer's events beyond Trainer's, to each callback that defines it; nothing is read back."""
        for callback in self.callback_handler.callbacks:
            if hasattr(callback, event):
                getattr(callback, event)(self.args, self.state, self.control)

    def training_step(
        self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None = None
    ) -> torch.Tensor:
        """Trainer's step with the LoRA layers' step forms (hf_lora_ds.training: ZeRO-3's linear, updates by one
        matmul, inputs uncast under autocast on an accelerator), recording the learning rate it applies (the final
        adapter check's measure), then, after an optimizer step's last micro-batch, the preemption decision: before
        ``on_step_end``, so every callback sees the save and the stop there, as it sees Trainer's own decisions."""
        self.max_learning_rate = max(self.max_learning_rate, *(group["lr"] for group in self.optimizer.param_groups))
        with (
            zero3_linear_for_lora(self.args.engine.zero.zero3_linear),
            inputs_as_they_come(self._uncast_lora_layers),
            updates_in_one_matmul(self.one_matmul_layers),
        ):
            loss = super().training_step(model, inputs, num_items_in_batch)
        if self.preemption is not None and self.accelerator.sync_gradients:
            self.preemption.stop_if_signalled(self.control, self.args.device)
        return loss

    def evaluate_answers(self) -> dict[str, EvalResult]:
        """Answer accuracy before training and after, reported (hf_lora_ds.trainer.answers); ``{}`` without eval
        records. Every rank must call it."""
        return before_and_after(self)

    def base_model_view(self) -> AbstractContextManager:
        """The base the run started from, for the "before" eval: the adapter switched off or, where PEFT rewrote
        the base to its residual (PiSSA, OLoRA, CorDA), the adapter set back to its start, which is the original
        base again. Under ZeRO-3 every rank must enter it (each tensor is gathered)."""
        if self.adapter_start is not None:
            return adapter_set_to(self.model, self.adapter_start)
        return self.model.disable_adapter()

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        """Trainer's optimizer, or LoRA+ / LoRA-FA (``--lora_optimizer``: hf_lora_ds.training.lora_optimizers),
        built here so that DeepSpeed receives it as its client optimizer."""
        if self.optimizer is None and self.args.lora_optimizer != "adamw":
            self.optimizer = create_lora_optimizer(self.model if model is None else model, self.args)
        return super().create_optimizer(model)

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """The causal-LM loss, from the LM head at the supervised positions only where that applies, and checked: a
        NaN or infinite training loss stops the run at the end of its logging window, naming the step, the samples
        and the last complete checkpoint, or with ``--on_nonfinite skip`` has its step dropped (training.nonfinite)."""
        labelled = inputs.get("labels") is not None or inputs.get("shift_labels") is not None  # SP shards: shifted
        if self.supervised_logits_only and not self._logits_for_metrics and labelled:
            result = self._supervised_loss(model, inputs, return_outputs, num_items_in_batch)
        else:
            inputs = {key: value for key, value in inputs.items() if key != SUPERVISED_POSITIONS}
            result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if model.training:
            loss = result[0] if return_outputs else result
            loss = self.nonfinite.check_loss(loss, inputs, self.state.global_step + 1)
            result = (loss, *result[1:]) if return_outputs else loss
        return result

    def _get_grad_norm(self, model: torch.nn.Module, grad_norm: torch.Tensor | float | None = None):
        """Trainer's gradient norm of the step, then the non-finite check (hf_lora_ds.training.nonfinite).

        Overridden (a private Trainer method): the one point of ``_inner_training_loop`` holding the step's clipped
        gradient norm before ``optimizer.step()``, under DDP, DeepSpeed and one process alike; no callback gets it."""
        grad_norm = full_grad_norm(super()._get_grad_norm(model, grad_norm=grad_norm))
        ends = ends_window(self.args, self.state)  # the non-finite check reads the device only at a window's end
        self.nonfinite.check_grad_norm(grad_norm, model, self.state.global_step + 1, self.is_deepspeed_enabled, ends)
        return grad_norm

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """With ``--on_nonfinite skip``, each training log (and the final train metrics) also carries
        ``nonfinite_skipped``: how many optimizer steps this run has dropped so far. It ends a non-finite window."""
        if "loss" in logs or "train_loss" in logs:
            self.nonfinite.end_window(applied=self.state.global_step)
            if self.args.on_nonfinite == "skip":
                logs = {**logs, "nonfinite_skipped": self.nonfinite.skipped}
        super().log(logs, start_time)

    def _supervised_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool,
        num_items_in_batch: torch.Tensor | int | None,
    ):
        """The causal-LM loss with the LM head applied only where the shifted label is not -100.

        Same value and gradients as Trainer's loss from full logits (see hf_lora_ds.training.supervised_logits). With
        the fused head the returned outputs hold the loss only (no logits exist); otherwise ``outputs.logits`` are
        ``(num_supervised, vocab)``: the rows of the supervised positions, in order.
        """
        rows, targets = supervised_targets(inputs)
        forward_inputs = {k: v for k, v in inputs.items() if k not in ("labels", "shift_labels", SUPERVISED_POSITIONS)}
        self.supervised_in_forward = rows.numel()  # the forward gets no labels: ThroughputCallback counts this
        outputs = self._fused_loss_forward(model, forward_inputs, rows, targets)
        if outputs is None:  # logits of the rows only where the model passes the head's rows on as they come
            with head_selects_rows(self.model.get_output_embeddings(), rows) if self._position_mask else nullcontext():
                outputs = model(**forward_inputs)
            outputs.loss = supervised_cross_entropy(supervised_rows(outputs.logits, rows), targets)
        self.supervised_in_forward = None
        loss = normalised_loss(outputs.loss, rows.numel(), num_items_in_batch)
        if self.sequence_parallel > 1 and model.training:  # a shard of each sequence (training.sequence_parallel)
            data_parallel = self.args.engine.data_parallel_size(self.accelerator.num_processes)
            loss = sequence_parallel_loss(loss, sequence_parallel_group(), self._deepspeed_divisor, data_parallel)
        elif (
            self.args.average_tokens_across_devices
            and self.model_accepts_loss_kwargs
            and num_items_in_batch is not None
        ):
            # Trainer's own scaling: num_items_in_batch counts every rank's tokens, and DDP/DeepSpeed average gradients.
            replicas = self.accelerator.num_processes // self.get_tp_size() if self.args.n_gpu <= 1 else self.args.n_gpu
            loss = loss * replicas
        outputs.loss = loss
        return (loss, outputs) if return_outputs else loss

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> torch.Tensor | int | None:
        """Under sequence parallelism the batches are shards without ``labels`` (Trainer would count nothing): the
        trained tokens of the global batch, from every rank's ``shift_labels``; each shard indexed (index_shards)."""
        if self.sequence_parallel > 1 and batch_samples and "shift_labels" in batch_samples[0]:
            index_shards(batch_samples)
            return supervised_tokens_in_shards(batch_samples, device)
        return super()._get_num_items_in_batch(batch_samples, device)

    def _fused_loss_forward(
        self, model: torch.nn.Module, forward_inputs: dict[str, Any], rows: torch.Tensor, targets: torch.Tensor
    ) -> CausalLMOutputWithPast | None:
        """The model's forward with its head computing the summed loss chunk by chunk (no logits at all), or None
        where the head cannot (then and for the rest of the run, with one line if the model changed its head's
        output: this batch's forward is thrown away and redone on the logits path)."""
        head = fused_head(self.model) if self._fused_head_loss is not False else None
        if head is None:
            return None
        # The model's code is the same every step: its output is compared with the head's once, not read every step.
        outputs = fused_loss_outputs(model, head, forward_inputs, rows, targets, check=self._fused_head_loss is None)
        self._fused_head_loss = outputs is not None
        if outputs is None:
            logger.info(
                f"fused LM head loss: off, {type(self.model.get_base_model()).__name__}.forward changes the "
                "head's output; the loss uses supervised-position logits"
            )
        return outputs

    def prediction_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ):
        """Metrics read the logits of every position, so only loss-only evaluations take the supervised path."""
        self._logits_for_metrics = not prediction_loss_only
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        finally:
            self._logits_for_metrics = False

    def _get_train_sampler(self, train_dataset: torch.utils.data.Dataset | None = None):
        """``group_by_length`` (the default here) with the lengths the dataset already has (of its packed rows, for
        packed batching) and an order every rank and every resume draws alike (see LengthGroupedEpochSampler)."""
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if self.args.train_sampling_strategy != "group_by_length" or not isinstance(
            training_samples(dataset), ChatSFTDataset
        ):
            return super()._get_train_sampler(train_dataset)
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        batch_size = self.args.train_batch_size * self.args.gradient_accumulation_steps
        return LengthGroupedEpochSampler(batch_size, dataset.lengths, seed)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Check every adapter Trainer writes (final and checkpoints): under ZeRO-3 a missing gather saves
        zero-size tensors without any error, and the run only fails later, at merge or load time.

        Under FSDP2 the adapter is gathered whole onto rank 0 (a collective: every rank), whatever the state dict
        type: Trainer writes none for SHARDED_STATE_DICT (Accelerate's default, for resuming), and for
        FULL_STATE_DICT it would gather every frozen base weight onto rank 0 too, only for PEFT to keep the LoRA
        ones. The checkpoint's resume state stays Trainer's (accelerate's ``save_fsdp_model``, either type)."""
        with save_failures(output_dir or self.args.output_dir, self.args.output_dir):
            if self.is_fsdp_enabled:
                self._save(output_dir, state_dict=full_adapter_state_dict(self.model))
                if self.args.push_to_hub and not _internal_call:  # as Trainer.save_model does after its own save
                    self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)
            else:
                super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            verify_adapter(output_dir or self.args.output_dir, base_model=self.model.get_base_model().config)

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """A checkpoint that cannot be written (full disk, no permission) ends the run with one line naming it, the
        cause and the last complete checkpoint, which stays intact (hf_lora_ds.training.checkpoints)."""
        checkpoint = Path(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        self.nonfinite.end_window(applied=self.state.global_step)  # no checkpoint of weights a NaN reached
        with save_failures(checkpoint, self.args.output_dir):
            super()._save_checkpoint(model, trial)

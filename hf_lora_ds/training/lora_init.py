"""The base model wrapped with its adapter as ``--lora_init`` starts it, including the inits that read data or
weights a ZeRO-3 rank does not hold whole.

- PiSSA, OLoRA, orthogonal: PEFT's own initialisation at wrap time; for the SVD or QR, PEFT gathers each ZeRO-3
  weight on its own (``gather_params_ctx``) and keeps rank 0's residual.
- EVA (after wrapping) and CorDA (before): the base runs over ``--lora_init_samples`` training samples, taken from
  the run's own dataset and batched by its own collator. Every rank runs the same samples (PEFT's cross-rank gather
  of layer inputs is off), so the start does not depend on the number of ranks. Under ZeRO-3 each rank holds a slice
  of every weight until the engine exists; ``gathered_module_by_module`` lets that forward gather one module's
  weights for the time of its own forward, as the engine would, never the whole model.
- LoftQ (after wrapping): hf_lora_ds.model.quantization.fit_loftq, one gathered weight at a time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from peft import LoraConfig, PeftModel
from peft.tuners.lora import corda
from peft.tuners.lora.eva import initialize_lora_eva_weights
from peft.tuners.tuners_utils import _maybe_include_all_linear_layers
from peft.utils.integrations import gather_params_ctx
from transformers.integrations import is_deepspeed_zero3_enabled

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.lora_init import DataPass
from hf_lora_ds.config.vision import vision_training
from hf_lora_ds.model.lora import wrap_with_lora
from hf_lora_ds.model.quantization import fit_loftq

__all__ = ["gathered_module_by_module", "init_batches", "wrap_as_initialised"]

Batch = dict[str, torch.Tensor]


def wrap_as_initialised(
    model: torch.nn.Module,
    config: LoraConfig,
    args: SFTTrainingArguments,
    dataset: Any,
    collator: Callable[[list], Batch] | None,
) -> PeftModel:
    """``model`` wrapped with ``config``'s adapter, started as ``args.lora_init`` says (a PeftModel is kept as it
    is). ``dataset`` and ``collator`` are the run's; EVA and CorDA read ``args.lora_init_samples`` of its samples."""
    if isinstance(model, PeftModel):
        return model
    init = args.lora_start
    if init.data_pass is DataPass.CORDA:
        config = _maybe_include_all_linear_layers(config, model)  # CorDA matches the targets by name before PEFT does
        corda_pass(model, config, init_batches(dataset, collator, args.lora_init_samples, 1, args.seed))
    model = wrap_with_lora(model, config, vision_training(args))
    if init.data_pass is DataPass.EVA:
        batches = init_batches(dataset, collator, args.lora_init_samples, args.per_device_train_batch_size, args.seed)
        eva_pass(model, batches)
    elif init.loftq:
        fit_loftq(model, args.model_name_or_path if os.path.isdir(args.model_name_or_path) else None)
    return model


def init_batches(
    dataset: Any, collator: Callable[[list], Batch] | None, samples: int, batch_size: int, seed: int
) -> list[Batch]:
    """``samples`` of the dataset's samples drawn with ``seed`` (the same on every rank), in batches the run's
    collator builds."""
    if collator is None:
        raise ValueError("--lora_init eva and corda run the base over training samples: pass data_collator")
    chosen = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:samples].tolist()
    return [
        dict(collator([dataset[i] for i in chosen[start : start + batch_size]]))
        for start in range(0, len(chosen), batch_size)
    ]


@contextmanager
def gathered_module_by_module(model: torch.nn.Module) -> Iterator[None]:
    """Under ZeRO-3 before the engine exists: each module's own parameters gathered from the ranks for the time of
    its forward, then released (a collective, so every rank must run the same forwards). Elsewhere: nothing."""
    if not is_deepspeed_zero3_enabled():
        yield
        return
    open_gathers: dict[torch.nn.Module, list[ExitStack]] = {}

    def gather(module: torch.nn.Module, _inputs: Any) -> None:
        stack = ExitStack()
        stack.enter_context(gather_params_ctx(list(module.parameters(recurse=False)), modifier_rank=None))
        open_gathers.setdefault(module, []).append(stack)

    def release(module: torch.nn.Module, _inputs: Any, _output: Any) -> None:
        open_gathers[module].pop().close()

    owners = [module for module in model.modules() if next(module.parameters(recurse=False), None) is not None]
    handles = [
        hook
        for module in owners
        for hook in (module.register_forward_pre_hook(gather), module.register_forward_hook(release))
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for stacks in open_gathers.values():  # a forward that raised leaves its modules gathered
            for stack in stacks:
                stack.close()


def _decoder_forward(model: torch.nn.Module, batch: Batch) -> Any:
    """The decoder alone: the layer inputs are all the passes read, and the head's vocabulary-sized logits would be
    the largest tensor of the pass."""
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    return base.get_decoder()(**{key: value for key, value in batch.items() if key != "labels"})


@torch.no_grad()
def eva_pass(model: PeftModel, batches: list[Batch]) -> None:
    """PEFT's EVA: incremental SVDs of every adapted layer's inputs (supervised positions only, PEFT's default),
    cycling over ``batches`` until the top components settle; ranks move to where the explained variance is."""
    with gathered_module_by_module(model):
        initialize_lora_eva_weights(
            model,
            dataloader=batches,
            forward_fn=_decoder_forward,
            gather_distributed_inputs=False,
            show_progress_bar=False,
        )


@torch.no_grad()
def corda_pass(model: torch.nn.Module, config: LoraConfig, samples: list[Batch]) -> None:
    """PEFT's CorDA preprocessing (``preprocess_corda``) in its instruction-previewed mode, step by step so that each
    weight can be gathered for its own SVD: the covariance of every target's inputs over ``samples`` (one sample a
    batch: PEFT's hook takes one sequence), then each weight's covariance-weighted SVD, cut to its top r right
    away (PEFT keeps every layer's full factors until the end)."""
    targets = [module for _name, module in corda.target_modules(model, config)]
    with gathered_module_by_module(model):
        corda.calib_cov_distribution(model, config, lambda: [_decoder_forward(model, s) for s in samples], None, None)
    for module in targets:
        with gather_params_ctx(module.weight, modifier_rank=None):
            eigens = corda.collect_eigens_for_layer(module, config)
        rank = config.r
        module.eigens = corda.CordaEigens(
            S_WC=eigens.S_WC[:rank].clone(), U_WC=eigens.U_WC[:, :rank].clone(), V_WC=eigens.V_WC[:, :rank].clone()
        )
        del module.covariance_matrix, module.sample_count

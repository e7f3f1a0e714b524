"""Generation-based answer accuracy for a model, in one process or sharded across ranks, and scoring alone.

Distributed, every rank generates the prompts ``eval.sharding.shard`` gives it and ``all_gather_object`` returns the
same predictions, in record order, to all. Under ZeRO-3 the weights are gathered whole for the eval where every rank
has room for them (:mod:`hf_lora_ds.eval.whole_weights`). Where not, and under FSDP2, ``generate`` runs with
``synced_gpus=True`` on the sharded model: one layer is gathered at a time, at the price of a model's worth of
all-gathers per decoding step, which the batch amortises. Plain DDP and ZeRO-0/1/2 hold full weights, so there ranks
generate independently. Greedy outputs do not depend on batch neighbours in fp32; bf16/fp16 GPU kernels may rarely
flip a near-tie token under other batching.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accelerate.utils import extract_model_from_parallel
from torch.distributed.fsdp import FSDPModule
from transformers import PreTrainedTokenizerBase, ProcessorMixin
from transformers.integrations import is_deepspeed_zero3_enabled

from hf_lora_ds.data.records import DataError, Record, load_records
from hf_lora_ds.distributed import gather_from_ranks, rank_and_world
from hf_lora_ds.eval.generation import generate, generate_with_images
from hf_lora_ds.eval.sharding import merge_shards, shard
from hf_lora_ds.eval.task_registry import get_task
from hf_lora_ds.eval.tasks import Sample, Task
from hf_lora_ds.eval.whole_weights import zero3_weights_gathered
from hf_lora_ds.training.memory_tracker import measure_peak
from hf_lora_ds.vision.encoding import template_image_text, with_image_text
from hf_lora_ds.vision.resolution import PixelBounds

__all__ = ["Prediction", "EvalResult", "evaluate", "score_predictions", "load_samples"]

# Tokens allowed beyond the longest reference, so a model that does not stop is seen adding text, not cut short.
EXTRA_TOKENS = 8


@dataclass(frozen=True)
class Prediction:
    """One scored completion, as written to the predictions JSONL."""

    index: int
    where: str
    prompt: str
    reference: str
    output: str
    answer: str | None
    correct: bool
    reason: str | None
    num_tokens: int | None = None
    stopped: bool | None = None


@dataclass
class EvalResult:
    """Accuracy and cost of one eval. Times are the slowest rank's; memory peaks are the largest rank's."""

    task: str
    num_samples: int
    num_correct: int
    accuracy: float
    reasons: dict[str, int]
    total_time_s: float
    generation_time_s: float | None = None
    generated_tokens: int | None = None
    generated_tokens_per_s: float | None = None
    peak_accelerator_bytes: int | None = None
    peak_host_rss_bytes: int | None = None
    world_size: int = 1
    generation_weights: str | None = None  # "whole", "gathered once" (ZeRO-3, per eval), "layer by layer" (per step)
    predictions: list[Prediction] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        """Everything but the predictions, JSON-ready (for ``eval_report.json`` and loggers)."""
        data = asdict(self)
        data.pop("predictions")
        return data


def load_samples(
    records: str | Path | Sequence[dict] | Sequence[Record],
    task: Task,
    system_prompt: str | None = None,
    images: bool = False,
) -> list[Sample]:
    """Read and check every record before any generation, so a bad one fails fast with its file, line and field.
    ``images``: the model takes images (a vision-language model's eval): records may hold them."""
    return [task.sample(r.data, system_prompt=system_prompt, where=r.where, images=images) for r in _load(records)]


def _load(records: str | Path | Sequence[dict] | Sequence[Record]) -> list[Record]:
    if isinstance(records, (str, Path)):
        return load_records(records)
    records = list(records)
    if not records:
        raise DataError("no eval records given")
    return records if isinstance(records[0], Record) else load_records(records)


def evaluate(
    model: Any,
    tokenizer: PreTrainedTokenizerBase | ProcessorMixin,
    records: str | Path | Sequence[dict] | Sequence[Record],
    task: str | Task,
    *,
    batch_size: int = 32,
    system_prompt: str | None = None,
    max_new_tokens: int | None = None,
    gather_zero3_weights: bool = True,
    image_bounds: PixelBounds | None = None,
    **generation_kwargs: Any,
) -> EvalResult:
    """Generate a completion for every record and score it with ``task``; the same result on every rank.

    ``max_new_tokens`` defaults to the task's, else to the longest reference plus a few tokens. Greedy unless
    ``generation_kwargs`` (passed to ``model.generate``) say otherwise. ``model`` may be wrapped (DDP, DeepSpeed);
    pass a ZeRO-3 model as its DeepSpeed engine, whose weights are then gathered for the eval unless
    ``gather_zero3_weights`` is False or some rank has no room for them.

    A vision-language model is evaluated with its processor as ``tokenizer``: records may hold images (as training
    records do), each prompt written with the images where the template writes them, and the images loaded within
    ``image_bounds`` (the run's ``--image_max_pixels``/``--image_min_pixels``; None: the defaults), as in training.
    """
    start = time.perf_counter()
    task = get_task(task)
    processor = tokenizer if isinstance(tokenizer, ProcessorMixin) else None
    tokenizer = processor.tokenizer if processor is not None else tokenizer
    samples = load_samples(records, task, system_prompt, images=processor is not None)
    prompts = _prompts(tokenizer, samples, processor is not None)
    lengths = [len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    budget = max_new_tokens or task.max_new_tokens or _reference_budget(tokenizer, samples)
    rank, world_size = rank_and_world()
    mine = shard(lengths, rank if world_size > 1 else 0, world_size)  # no process group: this process does all
    module = extract_model_from_parallel(model)

    with measure_peak(module.device) as peak:
        generation_start = time.perf_counter()
        with zero3_weights_gathered(model, gather_zero3_weights) as gathered:
            weights = "gathered once" if gathered else "layer by layer" if _shards_weights(module) else "whole"
            options = dict(
                batch_size=batch_size,
                max_new_tokens=budget,
                synced_gpus=world_size > 1 and weights == "layer by layer",
                **generation_kwargs,
            )
            if processor is None:
                outputs = generate(module, tokenizer, [prompts[i] for i in mine.indices], **options)
            else:
                outputs = generate_with_images(
                    module,
                    processor,
                    [prompts[i] for i in mine.indices],
                    [samples[i].images for i in mine.indices],
                    bounds=image_bounds,
                    wheres=[samples[i].where for i in mine.indices],
                    **options,
                )
        generation_time = time.perf_counter() - generation_start
    scored = [
        (i, _prediction(i, samples[i], prompts[i], task, out.text, out.num_tokens, out.stopped))
        for i, out in zip(mine.indices[: mine.num_real], outputs)
    ]
    stats = (generation_time, peak.accelerator_bytes, peak.host_rss_bytes, time.perf_counter() - start)
    gathered = gather_from_ranks((scored, stats))
    predictions = merge_shards([part for part, _ in gathered], len(samples))
    times, accelerator, host, totals = zip(*(s for _, s in gathered))
    generated = sum(p.num_tokens for p in predictions)
    return _result(
        task,
        predictions,
        max(totals),
        world_size=world_size,
        generation_weights=weights,
        generation_time_s=max(times),
        generated_tokens=generated,
        generated_tokens_per_s=generated / max(times),
        peak_accelerator_bytes=None if None in accelerator else max(accelerator),
        peak_host_rss_bytes=max(host),
    )


def _prompts(tokenizer: PreTrainedTokenizerBase, samples: list[Sample], images: bool) -> list[str]:
    """Each sample's conversation rendered up to the generation prompt; a vision-language model's with each image
    written as its template writes an image part, as training renders it (``hf_lora_ds.data.dataset``)."""
    image_text = template_image_text(tokenizer) if images else None
    return [
        tokenizer.apply_chat_template(
            with_image_text(s.prompt, image_text) if image_text else s.prompt,
            tokenize=False,
            add_generation_prompt=True,
        )
        for s in samples
    ]


def score_predictions(
    records: str | Path | Sequence[dict] | Sequence[Record],
    task: str | Task,
    *,
    system_prompt: str | None = None,
    prediction_field: str = "prediction",
) -> EvalResult:
    """Score completions made elsewhere: each record carries the task's fields plus ``prediction_field``."""
    start = time.perf_counter()
    task = get_task(task)
    loaded = _load(records)
    samples = load_samples(loaded, task, system_prompt)
    predictions = []
    for i, (record, sample) in enumerate(zip(loaded, samples)):
        output = record.data.get(prediction_field)
        if not isinstance(output, str):
            problem = "is missing" if output is None else f"must be a string, got {type(output).__name__}"
            raise DataError(f"{record.where}: field '{prediction_field}' {problem} (the completion to score)")
        prompt = "\n".join(f"{m['role']}: {m['content']}" for m in sample.prompt)
        predictions.append(_prediction(i, sample, prompt, task, output))
    return _result(task, predictions, time.perf_counter() - start)


def _prediction(
    index: int,
    sample: Sample,
    prompt: str,
    task: Task,
    output: str,
    num_tokens: int | None = None,
    stopped: bool | None = None,
) -> Prediction:
    verdict = task.score(output, sample)
    return Prediction(
        index,
        sample.where,
        prompt,
        sample.reference,
        output,
        verdict.answer,
        verdict.correct,
        verdict.reason,
        num_tokens,
        stopped,
    )


def _result(task: Task, predictions: list[Prediction], total_time: float, **cost: Any) -> EvalResult:
    correct = sum(p.correct for p in predictions)
    reasons = Counter(p.reason or "incorrect" for p in predictions if not p.correct)
    return EvalResult(
        task=task.name,
        num_samples=len(predictions),
        num_correct=correct,
        accuracy=correct / len(predictions),
        reasons=dict(reasons.most_common()),
        total_time_s=total_time,
        predictions=predictions,
        **cost,
    )


def _reference_budget(tokenizer: PreTrainedTokenizerBase, samples: list[Sample]) -> int:
    """Room for the longest reference, its end-of-turn token and ``EXTRA_TOKENS`` more."""
    lengths = tokenizer([s.reference for s in samples], add_special_tokens=False)["input_ids"]
    return max(len(ids) for ids in lengths) + 1 + EXTRA_TOKENS


def _shards_weights(model: Any) -> bool:
    """Each forward gathers weights from every rank: ZeRO-3 (which tags the parameters it partitions with ``ds_id``,
    also when not set up via transformers) or FSDP2 (``fully_shard`` makes its modules ``FSDPModule``s)."""
    if is_deepspeed_zero3_enabled() or isinstance(model, FSDPModule):
        return True
    return any(hasattr(p, "ds_id") for p in model.parameters())

"""Batched greedy generation whose outputs equal one-by-one generation, and that stops at the end of the turn.

One prompt at a time wastes the hardware: a GPU decoding step of 32 rows costs little more than one of a single row.
Batching right needs the prompts' shared prefix (template header, system prompt) computed once and handed to every
batch as its cache, left padding between that prefix and each row's own tokens, prompts sorted longest first (an
out-of-memory shows in the first batch) with results put back in order, on a CPU the LM head a vocabulary chunk at a
time (bench/README.md), and stopping at the template's end-of-turn token as well as eos (a Qwen base tokenizer's eos
is ``<|endoftext|>``). The tokenizer is never modified: padding is done here.

A model with linear-attention, state-space or short-convolution layers (hf_lora_ds.model.layer_kinds) carries a state
along the sequence that padding between the prefix and a row's own tokens would change (their last logits moved by up
to 0.06 on the tiny hybrid families), and transformers cannot copy its prefix cache for a batch: its prompts are
batched only with prompts of equal length, unpadded and without a shared prefix, or one by one where every rank must
make the same number of calls (``synced_gpus``).

A vision-language model's prompts go through its processor (``generate_with_images``), which expands each image into
its tokens and makes its pixels: batched where the expanded prompts are of one length (images of one size and prompts
of one length: no padding, so every family's outputs equal one-by-one generation), one by one otherwise.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule
from transformers import DynamicCache, PreTrainedTokenizerBase, ProcessorMixin
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from hf_lora_ds.config.batching import VARLEN_ATTENTION
from hf_lora_ds.data.dataset import TemplateError, render_samples
from hf_lora_ds.model.layer_kinds import sequence_mixers
from hf_lora_ds.vision.images import load_image
from hf_lora_ds.vision.resolution import PixelBounds

__all__ = ["Generation", "generate", "generate_with_images", "stop_token_ids", "length_order"]


@dataclass(frozen=True)
class Generation:
    """One completion: text up to (not including) the stop token, tokens generated (stop token included)."""

    text: str
    num_tokens: int
    stopped: bool


def stop_token_ids(tokenizer: PreTrainedTokenizerBase, model: Any = None) -> list[int]:
    """Token ids that end a completion: the template's end-of-turn token, the tokenizer's eos, the model's eos."""
    ids = [_end_of_turn_id(tokenizer), tokenizer.eos_token_id]
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += configured if isinstance(configured, list) else [configured]
    unique = list(dict.fromkeys(i for i in ids if i is not None))
    if not unique:
        raise ValueError("the tokenizer has no eos_token and its chat template no end-of-turn token; set eos_token")
    return unique


def _end_of_turn_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The special token the chat template closes an assistant message with, found the way training finds it."""
    if tokenizer.chat_template is None:
        return None
    content = "ok"
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]
    try:
        [sample] = render_samples(tokenizer, conversation)
    except TemplateError:
        return None
    text, (start, end) = sample.text, sample.spans[-1]
    return tokenizer.convert_tokens_to_ids(text[start + len(content) : end])


def length_order(lengths: Sequence[int]) -> list[int]:
    """Indices longest first; ties keep input order so the order (and so every batch) is deterministic."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def generate(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    batch_size: int = 32,
    max_new_tokens: int = 64,
    synced_gpus: bool = False,
    **generation_kwargs: Any,
) -> list[Generation]:
    """Complete already-rendered ``prompts`` in batches of ``batch_size``, greedily unless ``generation_kwargs`` say
    otherwise, and return them in input order.

    ``synced_gpus`` must be True where every rank's forward gathers weights (DeepSpeed ZeRO-3, FSDP2) with several
    ranks, and then every rank must make the same number of calls (see :mod:`hf_lora_ds.eval.evaluator`).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    encoded = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    stops = stop_token_ids(tokenizer, model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    options = dict(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stops, pad_token_id=pad_id, use_cache=True
    )
    options.update(generation_kwargs)
    beams = options.get("num_beams") or getattr(getattr(model, "generation_config", None), "num_beams", 1) or 1
    unpadded = bool(sequence_mixers(model))  # a state along the sequence: no padding, no shared prefix
    shared = _shared_prefix_length(encoded) if encoded and not synced_gpus and beams == 1 and not unpadded else 0
    prefix = encoded[0][:shared] if shared else []
    lengths = [len(ids) for ids in encoded]
    order = length_order(lengths)
    results: list[Generation | None] = [None] * len(encoded)
    was_training = model.training
    model.eval()
    head = _swap_in_chunked_head(model) if not synced_gpus else None
    try:
        with torch.no_grad(), _attention_kernel_unwrapped(model), _generation_kernel(model):
            prefix_cache = _prefix_cache(model, prefix) if prefix else None
            for rows in _batches(order, lengths, 1 if unpadded and synced_gpus else batch_size, unpadded):
                own = [encoded[i][len(prefix) :] for i in rows]
                input_ids, attention_mask = _pad_after_prefix(prefix, own, pad_id, model.device)
                if prefix_cache is not None:
                    options[_cache_keyword(model)] = _copy_for_batch(prefix_cache, len(rows))
                with _root_parameters_gathered(model):
                    output = model.generate(
                        input_ids=input_ids, attention_mask=attention_mask, synced_gpus=synced_gpus, **options
                    )
                for i, tokens in zip(rows, output[:, input_ids.shape[1] :].tolist()):
                    results[i] = _decode(tokenizer, tokens, stops)
    finally:
        if head is not None:
            _causal_lm(model).set_output_embeddings(head)
        model.train(was_training)
    return results  # type: ignore[return-value]


def generate_with_images(
    model: Any,
    processor: ProcessorMixin,
    prompts: Sequence[str],
    images: Sequence[Sequence[Any]],
    *,
    bounds: PixelBounds | None = None,
    wheres: Sequence[str] | None = None,
    batch_size: int = 32,
    max_new_tokens: int = 64,
    synced_gpus: bool = False,
    **generation_kwargs: Any,
) -> list[Generation]:
    """Complete rendered ``prompts`` of a vision-language model, each with its ``images`` (``ImageRef``s in the order
    the prompt writes them), greedily unless ``generation_kwargs`` say otherwise, and return them in input order.

    Images are loaded within ``bounds`` (None: the defaults), as training loads them. The processor expands each
    prompt's images into their tokens; prompts whose expansions are of one length (and image count) are batched,
    unpadded, the others go one by one: padding would move a row's image positions in some families' rotary or
    attention schemes. With ``synced_gpus`` every rank makes one call per prompt, as ``generate`` does for a model
    that cannot be padded. An image that cannot be read names ``wheres[i]``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    tokenizer = processor.tokenizer
    wheres = list(wheres) if wheres is not None else [f"prompt {i}" for i in range(len(prompts))]
    bounds = bounds or PixelBounds()
    pictures = [[bounds.apply(load_image(ref, where)) for ref in refs] for refs, where in zip(images, wheres)]
    encoded = [_processed(processor, [prompt], [row]) for prompt, row in zip(prompts, pictures)]
    stops = stop_token_ids(tokenizer, model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    options = dict(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stops, pad_token_id=pad_id, use_cache=True
    )
    options.update(generation_kwargs)
    # One batch per (expanded length, image count), longest first: rows of a batch need no padding.
    shapes = [(inputs["input_ids"].shape[1], len(row)) for inputs, row in zip(encoded, pictures)]
    keys = {shape: k for k, shape in enumerate(sorted(set(shapes), reverse=True))}
    order = sorted(range(len(prompts)), key=lambda i: keys[shapes[i]])
    results: list[Generation | None] = [None] * len(prompts)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _attention_kernel_unwrapped(model):
            for rows in _batches(order, [keys[s] for s in shapes], 1 if synced_gpus else batch_size, True):
                alone = len(rows) == 1
                inputs = _on_model(
                    encoded[rows[0]] if alone else _processed(processor, *_batch(rows, prompts, pictures)), model
                )
                with _root_parameters_gathered(model):
                    output = model.generate(**inputs, synced_gpus=synced_gpus, **options)
                for i, tokens in zip(rows, output[:, inputs["input_ids"].shape[1] :].tolist()):
                    results[i] = _decode(tokenizer, tokens, stops)
    finally:
        model.train(was_training)
    return results  # type: ignore[return-value]


def _processed(processor: ProcessorMixin, prompts: list[str], pictures: list[list[Any]]) -> dict[str, torch.Tensor]:
    """The processor's tensors for ``prompts`` and their images (none for a batch of text prompts)."""
    images = pictures if any(pictures) else None
    return dict(processor(text=prompts, images=images, return_tensors="pt"))


def _on_model(inputs: dict[str, torch.Tensor], model: Any) -> dict[str, torch.Tensor]:
    """``inputs`` on the model's device, the pixels in the model's dtype (a bf16 model takes bf16 pixels)."""
    dtype = getattr(model, "dtype", None)
    return {
        key: value.to(model.device, dtype=dtype) if value.is_floating_point() and dtype else value.to(model.device)
        for key, value in inputs.items()
    }


def _batch(rows: list[int], prompts: Sequence[str], pictures: list[list[Any]]) -> tuple[list[str], list[list[Any]]]:
    return [prompts[i] for i in rows], [pictures[i] for i in rows]


def _batches(order: list[int], lengths: Sequence[int], batch_size: int, equal_lengths: bool) -> list[list[int]]:
    """``order`` cut into batches of ``batch_size``; with ``equal_lengths``, each batch's prompts of one length
    (``order`` is longest first, so equal lengths are neighbours).

    >>> _batches([0, 1, 2, 3], [5, 5, 5, 2], 2, equal_lengths=True)
    [[0, 1], [2], [3]]
    """
    runs = (
        [order]
        if not equal_lengths
        else [[i for i in order if lengths[i] == n] for n in dict.fromkeys(lengths[i] for i in order)]
    )
    return [run[start : start + batch_size] for run in runs for start in range(0, len(run), batch_size)]


def _shared_prefix_length(encoded: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with (the chat template's header and a shared system prompt), less one where that
    would be a whole prompt: each prompt keeps at least one token of its own, which the batch's prefill computes."""
    shortest = min(len(ids) for ids in encoded)
    first = encoded[0]
    length = 0
    while length < shortest - 1 and all(ids[length] == first[length] for ids in encoded):
        length += 1
    return length


@contextmanager
def _root_parameters_gathered(model: Any) -> Iterator[None]:
    """FSDP2 gathers a module's own parameters in hooks on that module: ``generate`` (PEFT's, then transformers')
    calls the inner causal LM, past the hooks of the root ``fully_shard`` wrapped, whose parameters (embeddings,
    final norm, head) would stay sharded. They are gathered for the call (FSDP2's ``unshard``, as the root's
    pre-forward hook does); each layer still gathers its own."""
    if not isinstance(model, FSDPModule):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


@contextmanager
def _attention_kernel_unwrapped(model: Any) -> Iterator[None]:
    """DeepSpeed's Ulysses sequence parallelism replaces the model's attention kernel in transformers' registry with
    a wrapper that drops the attention mask, in eval mode too (where it skips its all-to-all): left padding and the
    shared-prefix cache need their mask. Each rank generates its own prompts, so the plain kernel is the right one;
    it is put back for the call."""
    kernel = getattr(model.config, "_attn_implementation", None)
    overrides = ALL_ATTENTION_FUNCTIONS._local_mapping  # the registry's per-process overrides, where DeepSpeed's sits
    wrapper = overrides.get(kernel)
    if wrapper is None or not getattr(wrapper, "__module__", "").startswith("deepspeed.runtime.sequence_parallel"):
        yield
        return
    del overrides[kernel]
    try:
        yield
    finally:
        overrides[kernel] = wrapper


@contextmanager
def _generation_kernel(model: Any) -> Iterator[None]:
    """A model trained with ``varlen_attn`` generates under sdpa: that kernel reads the sample bounds of padding-free
    batches, and generation's batches are left-padded with a KV cache and carry none. Put back for training."""
    causal_lm = _causal_lm(model)
    kernel = getattr(causal_lm.config, "_attn_implementation", None)
    if kernel != VARLEN_ATTENTION:
        yield
        return
    causal_lm.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        causal_lm.set_attn_implementation(kernel)


def _causal_lm(model: Any) -> torch.nn.Module:
    """The transformers model under a PEFT wrapper (LoRA layers included, as PEFT injects them in place)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _decoder(model: Any) -> torch.nn.Module:
    """The transformer body without the LM head."""
    return _causal_lm(model).base_model


def _cache_keyword(model: Any) -> str:
    """``cache`` since transformers renamed ``past_key_values`` (the old name still works there, with a warning)."""
    forward = inspect.signature(_decoder(model).forward).parameters
    return "cache" if "cache" in forward else "past_key_values"


def _prefix_cache(model: Any, prefix: list[int]) -> DynamicCache:
    """The keys and values of the shared prefix, computed once, at batch size one and positions 0..len-1.

    Called through ``model`` itself, never an inner module: FSDP2 gathers the root's own parameters (embeddings, final
    norm, head) in the hooks it puts on the module it wrapped. ``logits_to_keep=1`` keeps the head to one row."""
    cache = DynamicCache(config=model.config)
    input_ids = torch.tensor([prefix], dtype=torch.long, device=model.device)
    model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **{_cache_keyword(model): cache})
    return cache


def _copy_for_batch(cache: DynamicCache, batch_size: int) -> DynamicCache:
    copied = copy.deepcopy(cache)
    copied.batch_repeat_interleave(batch_size)
    return copied


CHUNKED_HEAD_MIN_ROWS = 8
VOCABULARY_CHUNK = 512


class _VocabularyChunkedHead(torch.nn.Module):
    """A model's LM head computed ``VOCABULARY_CHUNK`` vocabulary columns at a time for a CPU batch of rows.

    One matmul of 32 rows against SmolLM2's 49,152 x 576 head took ~80 ms on this project's CPU (MKL, one thread),
    the same product in 512-column slices ~52 ms: each slice of the weights stays in cache while every row uses it.
    Each logit is the same dot product either way. Fewer than ``CHUNKED_HEAD_MIN_ROWS`` rows, bound by reading the
    weights rather than by arithmetic, keep the one matmul.
    """

    def __init__(self, head: torch.nn.Linear):
        super().__init__()
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.numel() // hidden.shape[-1] < CHUNKED_HEAD_MIN_ROWS:
            return self.head(hidden)
        weights = self.head.weight.split(VOCABULARY_CHUNK)
        biases = self.head.bias.split(VOCABULARY_CHUNK) if self.head.bias is not None else [None] * len(weights)
        return torch.cat([F.linear(hidden, w, b) for w, b in zip(weights, biases)], dim=-1)


def _swap_in_chunked_head(model: Any) -> torch.nn.Linear | None:
    """Put a :class:`_VocabularyChunkedHead` in place of a CPU model's plain ``nn.Linear`` head and return the head
    to put back; None (nothing swapped) for any other head: on a GPU, under LoRA or quantization, or with weights
    a DeepSpeed or FSDP hook must gather first."""
    causal_lm = _causal_lm(model)
    head = causal_lm.get_output_embeddings() if hasattr(causal_lm, "get_output_embeddings") else None
    plain = type(head) is torch.nn.Linear and type(head.weight) is torch.nn.Parameter
    if not plain or head.weight.device.type != "cpu" or hasattr(head.weight, "ds_id"):
        return None
    causal_lm.set_output_embeddings(_VocabularyChunkedHead(head))
    return head


def _pad_after_prefix(
    prefix: list[int], suffixes: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``prefix``, then each row's own tokens left-padded: the pads sit between them, masked, so every row's own
    tokens end at the last column and take the positions they have in the unpadded prompt."""
    width = max(len(ids) for ids in suffixes)
    input_ids = torch.full((len(suffixes), len(prefix) + width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    if prefix:
        input_ids[:, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
        attention_mask[:, : len(prefix)] = 1
    for row, ids in enumerate(suffixes):
        input_ids[row, input_ids.shape[1] - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, input_ids.shape[1] - len(ids) :] = 1
    return input_ids.to(device), attention_mask.to(device)


def _decode(tokenizer: PreTrainedTokenizerBase, tokens: list[int], stops: list[int]) -> Generation:
    """Cut at the first stop token: what follows it is padding. Other special tokens stay visible in the text, so a
    model that emits ``<|im_start|>`` mid-answer is scored as producing extra text, not silently cleaned up."""
    end = next((j for j, token in enumerate(tokens) if token in stops), None)
    kept = tokens if end is None else tokens[:end]
    text = tokenizer.decode(kept, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return Generation(text, len(tokens) if end is None else end + 1, end is not None)

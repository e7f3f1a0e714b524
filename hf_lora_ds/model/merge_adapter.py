"""Merge a LoRA adapter into its base and export a standalone HF model (safetensors + tokenizer), verified.

    python -m hf_lora_ds.merge --model_name_or_path BASE_DIR --adapter ADAPTER_DIR --out OUT_DIR
    python -m hf_lora_ds.merge --model_name_or_path DIR --gguf_file BASE.gguf --adapter ADAPTER_DIR --out OUT_DIR
        --gguf OUT.gguf

The export is only useful if it computes what base + adapter computed, so the command checks that itself: it
records base + adapter logits on a few prompts, merges, saves, reloads the saved model from disk and compares. The
adapter goes through ``verify_adapter`` first, so an empty ZeRO-3 adapter fails with the cause, not with a
``shape torch.Size([0])`` deep inside peft. A vision-language model is merged with its tower, exported with its
processor (image processor, chat template, tokenizer), and compared on prompts that each carry an image.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import torch
from PIL import Image
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase, ProcessorMixin

from hf_lora_ds.errors import UserError
from hf_lora_ds.model.adapter_check import verify_adapter
from hf_lora_ds.model.gguf_import import model_source, plain_model
from hf_lora_ds.model.lora import load_adapter
from hf_lora_ds.vision.modules import auto_model_class
from hf_lora_ds.vision.processor import load_processor, save_processor

__all__ = ["DEFAULT_PROMPTS", "MERGE_DTYPES", "MergeMismatchError", "merge_adapter"]

DEFAULT_PROMPTS = (
    "Hello, how can I help you today?",
    "What is the capital of France?",
    "王大丫丫的回答是--->3 + 4 =",
)
# Merging reorders the arithmetic (x(W + sBA) vs xW + s(xA)B): exact up to rounding of the stored dtype, and rounding
# grows with the values rounded, so the default tolerance is this fraction of the largest |logit| (at least 1).
# A trained model's logits reach ~20 (the bundled one's) to ~40: 1e-4 absolute failed fp32 merges that were right.
_DEFAULT_RTOL = {torch.float32: 1e-4, torch.bfloat16: 1e-1, torch.float16: 5e-2}
MERGE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class MergeMismatchError(UserError):
    """The merged export does not reproduce base + adapter within tolerance."""


def merge_adapter(
    base: str | os.PathLike,
    adapter: str | os.PathLike,
    out: str | os.PathLike,
    dtype: str = "auto",
    prompts: tuple[str, ...] | list[str] = DEFAULT_PROMPTS,
    atol: float | None = None,
    device: str = "cpu",
    gguf_file: str | None = None,
) -> float:
    """Write the merged model to ``out`` and return the max abs logit difference against base + adapter.

    ``dtype`` is the precision of the load, the merge and the saved weights ("auto": the base's stored dtype).
    Raises ``MergeMismatchError`` when the difference exceeds ``atol`` (default by dtype, relative to the largest
    logit: see ``_DEFAULT_RTOL``).
    ``gguf_file``: the base is that GGUF file in directory ``base`` (the export is still a Hugging Face directory).
    Only one model is held in memory at a time.
    """
    source, kwargs = model_source(str(base), gguf_file, "--model_name_or_path", need_tokenizer=False)
    config = AutoConfig.from_pretrained(source, **kwargs)
    verify_adapter(adapter, base_model=config)
    model_class = auto_model_class(config)
    processor = _processor(Path(adapter), source) if not gguf_file else None
    tokenizer = processor.tokenizer if processor is not None else _tokenizer(Path(adapter), source, kwargs)
    torch_dtype = "auto" if dtype == "auto" else MERGE_DTYPES[dtype]
    model = plain_model(model_class.from_pretrained(source, dtype=torch_dtype, **kwargs)).to(device)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))  # the adapter was trained on a tokenizer with added tokens
    model = load_adapter(model, adapter).eval()
    reference = _logits(model, processor or tokenizer, prompts, device)
    merged = model.merge_and_unload()
    saved_dtype = next(merged.parameters()).dtype
    merged.save_pretrained(out)
    if processor is not None:
        save_processor(processor, out)
    else:
        tokenizer.save_pretrained(out)
    del model, merged
    gc.collect()

    reloaded = model_class.from_pretrained(out, dtype=saved_dtype).to(device).eval()
    exported = _logits(reloaded, load_processor(out) if processor is not None else tokenizer, prompts, device)
    if not list(Path(out).glob("*.safetensors")):
        raise MergeMismatchError(f"No safetensors weights were written to {out}.")
    if atol is None:
        scale = max(1.0, max(ref.abs().max().item() for ref in reference))
        atol = _DEFAULT_RTOL.get(saved_dtype, 1e-1) * scale
    # Prompt by prompt, and "not <=": a NaN difference fails every comparison, so max() over the prompts would
    # drop it unless it came first, and "diff > atol" would pass it.
    diffs = [(ref - got).abs().max().item() for ref, got in zip(reference, exported)]
    for number, (prompt, diff) in enumerate(zip(prompts, diffs), start=1):
        if not diff <= atol:
            raise MergeMismatchError(
                f"Merged model in {out} differs from base + adapter by {diff:.3g} (> {atol:.3g}) in logits on prompt "
                f"{number} of {len(prompts)} ({prompt!r}). Merge in higher precision (--dtype float32) or check the "
                "adapter (a NaN or infinite logit fails any tolerance)."
            )
    return max(diffs)


def _processor(adapter: Path, base: str) -> ProcessorMixin | None:
    """A vision-language model's processor: the adapter's own when the run saved it, else the base's; None for a
    text model."""
    return load_processor(adapter) or (load_processor(base) if Path(base).is_dir() else None)


def _tokenizer(adapter: Path, base: str, base_kwargs: dict) -> PreTrainedTokenizerBase:
    """The adapter's own tokenizer when it saved one (it may hold added tokens), else the base's."""
    if (adapter / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(adapter)
    return AutoTokenizer.from_pretrained(base, **base_kwargs)


@torch.no_grad()
def _logits(model, processing: PreTrainedTokenizerBase | ProcessorMixin, prompts, device: str) -> list[torch.Tensor]:
    """Per-prompt logits in float32 (no padding, so nothing depends on the pad side or attention masks); with a
    processor, each prompt follows an image, so the tower and projector are compared too."""
    outputs = []
    for prompt in prompts:
        if isinstance(processing, ProcessorMixin):
            inputs = _image_prompt(processing, prompt)
        else:
            text = _render(processing, prompt)
            inputs = processing(text, return_tensors="pt", add_special_tokens=False)
            inputs = {"input_ids": inputs.input_ids}
        outputs.append(model(**{key: value.to(device) for key, value in inputs.items()}).logits.float().cpu())
    return outputs


def _image_prompt(processor: ProcessorMixin, prompt: str) -> dict[str, torch.Tensor]:
    """``prompt`` after a 64 x 64 gradient image, rendered and processed as the processor does for generation."""
    image = Image.linear_gradient("L").resize((64, 64)).convert("RGB")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return dict(processor(text=[text], images=[[image]], return_tensors="pt"))


def _render(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    if tokenizer.chat_template:
        messages = [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return prompt

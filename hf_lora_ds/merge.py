"""Merge a LoRA adapter into its base and export a standalone HF model (safetensors + tokenizer), verified.

    python -m hf_lora_ds.merge --base BASE_DIR --adapter ADAPTER_DIR --out OUT_DIR
    python -m hf_lora_ds.merge --base DIR --gguf_file BASE.gguf --adapter ADAPTER_DIR --out OUT_DIR --gguf OUT.gguf

The export is only useful if it computes what base + adapter computed, so the command checks that itself: it
records base + adapter logits on a few prompts, merges, saves, reloads the saved model from disk and compares. The
adapter goes through ``verify_adapter`` first, so an empty ZeRO-3 adapter fails with the cause, not with a
``shape torch.Size([0])`` deep inside peft.
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from hf_lora_ds.adapter import verify_adapter
from hf_lora_ds.errors import UserError, run_cli
from hf_lora_ds.gguf_export import GGUF_OUTTYPES, export_gguf
from hf_lora_ds.gguf_source import model_source, plain_model

__all__ = ["DEFAULT_PROMPTS", "MergeMismatchError", "merge_adapter", "main"]

DEFAULT_PROMPTS = (
    "Hello, how can I help you today?",
    "What is the capital of France?",
    "王大丫丫的回答是--->3 + 4 =",
)
# Merging reorders the arithmetic (x(W + sBA) vs xW + s(xA)B): exact up to rounding of the stored dtype, and rounding
# grows with the values rounded, so the default tolerance is this fraction of the largest |logit| (at least 1).
# A trained model's logits reach ~20 (the bundled one's) to ~40: 1e-4 absolute failed fp32 merges that were right.
_DEFAULT_RTOL = {torch.float32: 1e-4, torch.bfloat16: 1e-1, torch.float16: 5e-2}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
    source, kwargs = model_source(str(base), gguf_file, "--base", need_tokenizer=False)
    verify_adapter(adapter, base_model=AutoConfig.from_pretrained(source, **kwargs))
    tokenizer = _tokenizer(Path(adapter), source, kwargs)
    torch_dtype = "auto" if dtype == "auto" else _DTYPES[dtype]
    model = plain_model(AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs)).to(device)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))  # the adapter was trained on a tokenizer with added tokens
    model = PeftModel.from_pretrained(model, str(adapter)).eval()
    reference = _logits(model, tokenizer, prompts, device)
    merged = model.merge_and_unload()
    saved_dtype = next(merged.parameters()).dtype
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model, merged
    gc.collect()

    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=saved_dtype).to(device).eval()
    exported = _logits(reloaded, tokenizer, prompts, device)
    diff = max((ref - got).abs().max().item() for ref, got in zip(reference, exported))
    if atol is None:
        scale = max(1.0, max(ref.abs().max().item() for ref in reference))
        atol = _DEFAULT_RTOL.get(saved_dtype, 1e-1) * scale
    if not list(Path(out).glob("*.safetensors")):
        raise MergeMismatchError(f"No safetensors weights were written to {out}.")
    if not diff <= atol:
        raise MergeMismatchError(
            f"Merged model in {out} differs from base + adapter by {diff:.3g} (> {atol:.3g}) in logits on "
            f"{len(prompts)} prompts. Merge in higher precision (--dtype float32) or check the adapter."
        )
    return diff


def _tokenizer(adapter: Path, base: str, base_kwargs: dict) -> PreTrainedTokenizerBase:
    """The adapter's own tokenizer when it saved one (it may hold added tokens), else the base's."""
    if (adapter / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(adapter)
    return AutoTokenizer.from_pretrained(base, **base_kwargs)


@torch.no_grad()
def _logits(model, tokenizer: PreTrainedTokenizerBase, prompts, device: str) -> list[torch.Tensor]:
    """Per-prompt logits in float32 (no padding, so nothing depends on the pad side or attention masks)."""
    outputs = []
    for prompt in prompts:
        text = _render(tokenizer, prompt)
        input_ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids.to(device)
        outputs.append(model(input_ids=input_ids).logits.float().cpu())
    return outputs


def _render(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    if tokenizer.chat_template:
        messages = [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return prompt


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hf_lora_ds.merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="Base model directory the adapter was trained on.")
    parser.add_argument("--gguf_file", default=None,
                        help="The base is this GGUF file inside --base DIR (or pass the .gguf path as --base).")
    parser.add_argument("--adapter", required=True, help="Adapter directory (adapter_config.json + weights).")
    parser.add_argument("--out", required=True, help="Output directory for the merged model and tokenizer.")
    parser.add_argument("--dtype", default="auto", choices=["auto", *_DTYPES], help="Load/merge/save precision.")
    parser.add_argument("--prompt", action="append", help="Prompt for the logit check (repeatable).")
    parser.add_argument("--atol", type=float, default=None,
                        help="Max abs logit difference allowed (default: 1e-4 of the largest |logit| in float32, "
                        "5e-2 in float16, 1e-1 in bfloat16, and at least those values).")
    parser.add_argument("--gguf", default=None, type=Path,
                        help="Also write the merged model as this GGUF file (Llama and Qwen2), for llama.cpp/Ollama.")
    parser.add_argument("--gguf_type", default="f16", choices=GGUF_OUTTYPES,
                        help="Tensor type of the --gguf file (1-D tensors stay f32); default: %(default)s.")
    parser.add_argument("--device", default="cpu", help="Device for merge and check, e.g. cpu, cuda, cuda:1.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    prompts = tuple(args.prompt) if args.prompt else DEFAULT_PROMPTS
    diff = merge_adapter(args.base, args.adapter, args.out, args.dtype, prompts, args.atol, args.device, args.gguf_file)
    print(f"merged {args.adapter} into {args.base} -> {args.out}")
    print(f"max abs logit diff vs base + adapter: {diff:.3g} over {len(prompts)} prompts")
    if args.gguf is not None:
        print(f"GGUF ({args.gguf_type}) written to {export_gguf(args.out, args.gguf, args.gguf_type)}")
    return 0


if __name__ == "__main__":
    run_cli(main)

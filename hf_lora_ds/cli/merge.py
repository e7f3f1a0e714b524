"""``python -m hf_lora_ds.merge``: merge a LoRA adapter into its base and export a standalone HF model
(safetensors + tokenizer), verified against base + adapter, and optionally a GGUF file (hf_lora_ds.model.merge_adapter,
hf_lora_ds.model.gguf_export).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from transformers import AutoConfig

from hf_lora_ds.cli.flags import BASE_MODEL_SPELLINGS, respell
from hf_lora_ds.cli.log import configure_logging
from hf_lora_ds.errors import UserError, run_cli
from hf_lora_ds.launch.checks import check_output_path
from hf_lora_ds.model.adapter_check import check_adapter_directory
from hf_lora_ds.model.gguf_export import GGUF_OUTTYPES, check_gguf_architecture, export_gguf
from hf_lora_ds.model.gguf_import import model_source
from hf_lora_ds.model.merge_adapter import DEFAULT_PROMPTS, MERGE_DTYPES, merge_adapter


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hf_lora_ds.merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_name_or_path", required=True, help="Base model directory the adapter was trained on.")
    parser.add_argument(
        "--gguf_file",
        default=None,
        help="The base is this GGUF file inside --model_name_or_path DIR "
        "(or pass the .gguf path as --model_name_or_path).",
    )
    parser.add_argument("--adapter", required=True, help="Adapter directory (adapter_config.json + weights).")
    parser.add_argument("--out", required=True, help="Output directory for the merged model and tokenizer.")
    parser.add_argument("--dtype", default="auto", choices=["auto", *MERGE_DTYPES], help="Load/merge/save precision.")
    parser.add_argument("--prompt", action="append", help="Prompt for the logit check (repeatable).")
    parser.add_argument(
        "--atol",
        type=float,
        default=None,
        help="Max abs logit difference allowed (default: 1e-4 of the largest |logit| in float32, "
        "5e-2 in float16, 1e-1 in bfloat16, and at least those values).",
    )
    parser.add_argument(
        "--gguf",
        default=None,
        type=Path,
        help="Also write the merged model as this GGUF file (Llama and Qwen2), for llama.cpp/Ollama.",
    )
    parser.add_argument(
        "--gguf_type",
        default="f16",
        choices=GGUF_OUTTYPES,
        help="Tensor type of the --gguf file (1-D tensors stay f32); default: %(default)s.",
    )
    parser.add_argument("--device", default="cpu", help="Device for merge and check, e.g. cpu, cuda, cuda:1.")
    return parser.parse_args(respell(sys.argv[1:] if argv is None else argv, BASE_MODEL_SPELLINGS, parser.prog))


def _check_paths(args: argparse.Namespace) -> None:
    """The adapter, and the places the export goes, checked before a model is loaded or merged."""
    check_adapter_directory(args.adapter, "--adapter")
    check_output_path("--out", args.out)
    if args.gguf is not None:
        if args.gguf.is_dir():
            raise UserError(
                f"--gguf {args.gguf}: is a directory; pass the GGUF file to write (e.g. {args.gguf}/model.gguf)"
            )
        check_output_path("--gguf", args.gguf, file=True)
        source, kwargs = model_source(
            args.model_name_or_path, args.gguf_file, "--model_name_or_path", need_tokenizer=False
        )
        check_gguf_architecture(AutoConfig.from_pretrained(source, **kwargs), args.model_name_or_path)


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    args = _parse(argv)
    _check_paths(args)
    prompts = tuple(args.prompt) if args.prompt else DEFAULT_PROMPTS
    diff = merge_adapter(
        args.model_name_or_path, args.adapter, args.out, args.dtype, prompts, args.atol, args.device, args.gguf_file
    )
    # The command's result, printed (a single process): not logging.
    print(f"merged {args.adapter} into {args.model_name_or_path} -> {args.out}")
    print(f"max abs logit diff vs base + adapter: {diff:.3g} over {len(prompts)} prompts")
    if args.gguf is not None:
        print(f"GGUF ({args.gguf_type}) written to {export_gguf(args.out, args.gguf, args.gguf_type)}")
    return 0


def cli() -> None:
    """``python -m hf_lora_ds.merge``: a user error is one line on stderr and exit code 2 (hf_lora_ds.errors)."""
    run_cli(main)

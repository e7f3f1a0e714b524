"""Mixture-of-Experts LoRA, side by side in one run: supervised tokens per second and peak memory of

(a) ``moe``: ``LoraSFTTrainer`` on a Qwen3-MoE-shaped model, every linear layer and every routed expert adapted,
    the experts' kernel as ``--experts_implementation auto`` picks it for this device and dtype, no dropout (TRL's
    LoRA cannot drop on expert weights, so every variant runs without; the run's default drops on the Linear
    adapters only);
(b) ``moe_eager``: the same with transformers' per-expert Python loop (``--experts_implementation eager``), the path
    the LoRA'd experts must not fall back to where a grouped kernel runs;
(c) ``dense``: a dense Qwen3 of equal active parameters (its MLP as wide as the top-k experts together);
(d) ``trl``: TRL's ``SFTTrainer`` on the MoE model, with the same LoRA (the exact targets this package resolves,
    passed as its ``peft_config``), fp32, no gradient checkpointing (skipped when trl is missing).

The same generated chats (bench/throughput.py's), LoRA r=8, one epoch, each variant in its own process so its peak
memory is its own (RSS; on CUDA also the allocator's peak). The speed ratios use the process's CPU time where the run
is on the CPU (a shared machine's neighbours stay out of it), wall time on an accelerator. For the MoE variants the
script also counts the grouped GEMM calls of one training step (``aten::_grouped_mm``): zero means a per-expert loop.

    python bench/moe.py [--samples 128] [--batch_size 8] [--variants moe,moe_eager,dense,trl] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/throughput.py's chats, tokenizer and clock
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's hf_lora_ds, also when not installed

from throughput import TrainClock, common_args, load_tokenizer, make_conversations  # noqa: E402

from hf_lora_ds import IGNORE_INDEX, ChatSFTDataset, LoraSFTTrainer, SFTTrainingArguments, build_collator  # noqa: E402
from hf_lora_ds.callbacks.throughput import matmul_parameters  # noqa: E402
from hf_lora_ds.model.experts_kernel import choose_experts_implementation, use_experts_kernel  # noqa: E402
from hf_lora_ds.model.lora import lora_config_from_args  # noqa: E402
from hf_lora_ds.model.lora_targets import resolve_targets  # noqa: E402

VARIANTS = ("moe", "moe_eager", "dense", "trl")
# Qwen3-30B-A3B's proportions, scaled down: 8 experts, 2 a token, an expert's MLP as wide as the hidden size.
HIDDEN, LAYERS, EXPERTS, TOP_K, EXPERT_WIDTH = 128, 4, 8, 2, 128


def build_model(tokenizer, dense: bool) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=HIDDEN // 4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    if dense:  # the same active parameters: one MLP as wide as the top-k experts together
        return Qwen3ForCausalLM(Qwen3Config(intermediate_size=TOP_K * EXPERT_WIDTH, **common))
    config = Qwen3MoeConfig(
        num_experts=EXPERTS, num_experts_per_tok=TOP_K, moe_intermediate_size=EXPERT_WIDTH, **common
    )
    return Qwen3MoeForCausalLM(config)


def grouped_gemm_calls(trainer, batch: dict) -> int:
    """``aten::_grouped_mm`` calls in one forward and backward of ``batch`` (the training step's own work)."""
    from torch.profiler import profile

    model = trainer.model
    inputs = trainer._prepare_inputs(batch)
    with profile() as prof:
        trainer.compute_loss(model, inputs).backward()
    model.zero_grad(set_to_none=True)
    return sum(event.count for event in prof.key_averages() if event.key == "aten::_grouped_mm")


def make_trainer(variant: str, model, tokenizer, dataset: ChatSFTDataset, workdir: str, batch_size: int, device):
    args = SFTTrainingArguments(
        **common_args(workdir, batch_size) | {"use_cpu": device.type == "cpu"},
        experts_implementation="eager" if variant == "moe_eager" else "auto",
        lora_dropout=0.0,  # as TRL's must be: PEFT's ParamWrapper refuses dropout on expert weights
    )
    if variant == "trl":
        from trl import SFTConfig, SFTTrainer

        config = SFTConfig(
            **common_args(workdir, batch_size) | {"use_cpu": device.type == "cpu"},
            max_length=None,
            dataset_kwargs={"skip_prepare_dataset": True},
        )
        peft_config = resolve_targets(model, lora_config_from_args(args))  # the adapters this package trains
        return SFTTrainer(
            model, args=config, train_dataset=dataset.samples, processing_class=tokenizer, peft_config=peft_config
        )
    return LoraSFTTrainer(
        model,
        args,
        train_dataset=dataset,
        data_collator=build_collator("padded", tokenizer),
        processing_class=tokenizer,
    )


def measure(variant: str, options: argparse.Namespace) -> dict:
    device = torch.device(options.device)
    tokenizer = load_tokenizer("small", None)
    with tempfile.TemporaryDirectory() as workdir:
        dataset = ChatSFTDataset(
            make_conversations(options.samples, options.seed), tokenizer, max_length=512, cache_dir=workdir
        )
        model = build_model(tokenizer, dense=variant == "dense")
        requested = "eager" if variant == "moe_eager" else "auto"
        kernel = choose_experts_implementation(requested, device, torch.float32) if variant != "dense" else "-"
        if variant != "dense":
            use_experts_kernel(model, kernel)
        active = sum(matmul_parameters(model))  # a token's matmul weights: routed experts at top-k of them
        trainer = make_trainer(variant, model, tokenizer, dataset, workdir, options.batch_size, device)
        loader = trainer.get_train_dataloader()
        supervised = sum(int((batch["labels"][:, 1:] != IGNORE_INDEX).sum()) for batch in loader)
        calls = grouped_gemm_calls(trainer, next(iter(loader))) if variant != "dense" else 0
        clock = TrainClock()
        trainer.add_callback(clock)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
    return {
        "kernel": kernel,
        "grouped_gemm_calls": calls,
        "active_parameters": active,
        "supervised_tok_s": supervised / clock.seconds,
        "supervised_tok_cpu_s": supervised / clock.cpu_seconds,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # KiB on Linux
        "peak_device_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
        "wall_s": clock.seconds,
        "cpu_s": clock.cpu_seconds,
    }


def run_variant(variant: str, options: argparse.Namespace) -> dict | None:
    command = [sys.executable, __file__, "--worker", variant, "--samples", str(options.samples)]
    command += ["--batch_size", str(options.batch_size), "--seed", str(options.seed), "--device", options.device]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{variant} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(results: dict[str, dict], on_cpu: bool) -> None:
    speed = "supervised_tok_cpu_s" if on_cpu else "supervised_tok_s"
    print(
        f"{'variant':<11}{'kernel':>11}{'grouped GEMMs/step':>19}{'N_active':>10}{'sup. tok/s':>11}{'tok/CPU-s':>10}"
        f"{'peak RSS GiB':>13}{'device GiB':>11}{'vs moe':>8}{'vs dense':>9}{'vs trl':>8}"
    )
    for variant, r in results.items():
        ratios = "".join(
            f"{r[speed] / results[base][speed]:>{width}.2f}x" if base in results else f"{'-':>{width + 1}}"
            for base, width in (("moe", 7), ("dense", 8), ("trl", 7))
        )
        device = f"{r['peak_device_gib']:>11.2f}" if r["peak_device_gib"] is not None else f"{'-':>11}"
        print(
            f"{variant:<11}{r['kernel']:>11}{r['grouped_gemm_calls']:>19}{r['active_parameters']:>10,}"
            f"{r['supervised_tok_s']:>11.0f}{r['supervised_tok_cpu_s']:>10.0f}{r['peak_rss_gib']:>13.2f}{device}{ratios}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--samples", type=int, default=128, help="Generated conversations, one epoch (length grouping needs many)."
    )
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"Comma-separated, from {list(VARIANTS)}.")
    parser.add_argument("--seed", type=int, default=0, help="Seed for the generated conversations.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # one variant, in a subprocess
    options = parser.parse_args()
    if options.worker:
        print(json.dumps(measure(options.worker, options)))
        return
    variants = options.variants.split(",")
    if "trl" in variants and importlib.util.find_spec("trl") is None:
        print("trl is not installed: skipping the TRL SFTTrainer variant (pip install -e '.[bench]')")
        variants.remove("trl")
    print(
        f"Qwen3-MoE shape: hidden {HIDDEN}, {LAYERS} layers, {EXPERTS} experts, {TOP_K} a token, expert width "
        f"{EXPERT_WIDTH}; {options.samples} chats, batch {options.batch_size}, fp32, LoRA r=8 all-linear + experts, "
        f"{options.device}, {torch.get_num_threads()} threads, one process per variant"
    )
    start = time.perf_counter()
    results = {variant: run_variant(variant, options) for variant in variants}
    print_table({variant: r for variant, r in results.items() if r is not None}, options.device == "cpu")
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()

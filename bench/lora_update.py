"""The LoRA update by one ``addmm`` (hf_lora_ds.training.lora_update) against PEFT's form, in this package's training
step, side by side in one run.

A Qwen2.5-0.5B-wide model (hidden 896, MLP 4,864, 14 heads, 2 KV heads; ``--layers`` of them) with the benchmark's
300-token vocabulary, so the adapted layers are the step and the LM head is not; LoRA r=8 on every linear layer; a
batch of identical-length chats, so every step does the same work. ``LoraSFTTrainer`` trains with its defaults and
the step's form alternates every step (the first ``--warmup`` steps left out); printed: the median CPU time a step of
each form and the median of the per-pair ratios.

    python bench/lora_update.py [--layers 2] [--batch_size 4] [--words 60] [--steps 24] [--lora_dropout 0.05]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's hf_lora_ds, also when not installed

from hf_lora_ds import ChatSFTDataset, LoraSFTTrainer, SFTTrainingArguments, build_collator  # noqa: E402
from hf_lora_ds._testing.tiny_models import train_chat_tokenizer  # noqa: E402

WORDS = "the a cat dog sat on mat quick brown fox jumps over lazy river mountain answer question why how".split()


def chats(n: int, words: int) -> list[dict]:
    rng = random.Random(0)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words))

    return [{"messages": [{"role": "user", "content": sentence()}, {"role": "assistant", "content": sentence()}]}] * n


class AlternatingForms(TrainerCallback):
    """Even steps add the LoRA update by one matmul, odd steps in PEFT's form; CPU seconds of each step."""

    def __init__(self, trainer: LoraSFTTrainer):
        self.trainer, self.layers, self.seconds = trainer, trainer.one_matmul_layers, []

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        self.trainer.one_matmul_layers = self.layers if state.global_step % 2 == 0 else []
        self.start = time.process_time()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.seconds.append(time.process_time() - self.start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--words", type=int, default=60, help="words (tokens) of each turn")
    parser.add_argument("--steps", type=int, default=24, help="timed steps, half in each form")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--lora_dropout", type=float, default=0.05)
    options = parser.parse_args()
    tokenizer = train_chat_tokenizer([" ".join(WORDS)] * 50, vocab_size=300)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=options.layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    total = options.warmup + options.steps
    with tempfile.TemporaryDirectory() as work:
        dataset = ChatSFTDataset(chats(total * options.batch_size, options.words), tokenizer, cache_dir=work)
        args = SFTTrainingArguments(
            output_dir=work,
            max_steps=total,
            per_device_train_batch_size=options.batch_size,
            lora_dropout=options.lora_dropout,
            save_strategy="no",
            report_to="none",
            logging_steps=total,
            disable_tqdm=True,
        )
        trainer = LoraSFTTrainer(model, args, train_dataset=dataset, data_collator=build_collator("padded", tokenizer))
        timer = AlternatingForms(trainer)
        trainer.add_callback(timer)
        trainer.train()
    timed = timer.seconds[options.warmup - options.warmup % 2 :]  # whole pairs, one-matmul step first
    one_matmul, peft = timed[0::2], timed[1::2]
    ratios = [a / b for a, b in zip(one_matmul, peft)]
    print(
        f"{options.layers} layers of Qwen2.5-0.5B's width, batch {options.batch_size} x {len(dataset[0]['input_ids'])}"
        f" tokens, lora_dropout {options.lora_dropout}, {torch.get_num_threads()} threads, {len(ratios)} pairs\n"
        f"CPU s a step: one matmul {statistics.median(one_matmul):.3f}, PEFT's form {statistics.median(peft):.3f};"
        f" one matmul / PEFT's, median of pairs {statistics.median(ratios):.3f}"
        f" ({min(ratios):.3f}-{max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()

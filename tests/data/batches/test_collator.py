from __future__ import annotations

import pytest
import torch

from hf_lora_ds.data.batches.collator import build_collator, check_model_batching, supports_padding_free
from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset

RECORDS = [
    {"instruction": "12=", "output": "王大丫丫的回答是--->3 + 9"},
    {
        "messages": [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Bonjour!"},
            {"role": "user", "content": "Tell me a joke about cats."},
            {"role": "assistant", "content": "cats."},
        ]
    },
    {"instruction": "1=", "output": "0 + 1"},
]


@pytest.fixture
def samples(qwen_style_tokenizer, tmp_path):
    return list(ChatSFTDataset(RECORDS, qwen_style_tokenizer, cache_dir=tmp_path))


def test_padded_batch_pads_to_longest_with_masked_labels(qwen_style_tokenizer, samples):
    batch = build_collator("padded", qwen_style_tokenizer)(samples)
    longest = max(len(s["input_ids"]) for s in samples)
    assert batch["input_ids"].shape == batch["labels"].shape == (3, longest)
    for row, sample in enumerate(samples):
        n = len(sample["input_ids"])
        assert batch["input_ids"][row, :n].tolist() == sample["input_ids"]
        assert batch["labels"][row, :n].tolist() == sample["labels"]
        assert (batch["input_ids"][row, n:] == qwen_style_tokenizer.pad_token_id).all()
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all()
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (longest - n)


def test_pad_to_multiple_of(qwen_style_tokenizer, samples):
    batch = build_collator("padded", qwen_style_tokenizer, pad_to_multiple_of=16)(samples)
    assert batch["input_ids"].shape[1] % 16 == 0
    assert batch["labels"].shape == batch["input_ids"].shape


def test_padding_free_batch_has_no_pads_and_restarting_positions(qwen_style_tokenizer, samples):
    batch = build_collator("padding_free", qwen_style_tokenizer)(samples)
    total = sum(len(s["input_ids"]) for s in samples)
    assert batch["input_ids"].shape == (1, total)
    assert "attention_mask" not in batch
    starts = [0]
    for s in samples[:-1]:
        starts.append(starts[-1] + len(s["input_ids"]))
    assert [i for i, p in enumerate(batch["position_ids"][0].tolist()) if p == 0] == starts
    assert all(batch["labels"][0, i] == IGNORE_INDEX for i in starts)


def test_padding_free_loss_equals_padded_loss(tiny_model, qwen_style_tokenizer, samples):
    """Packed sequences must not attend to each other: the loss has to match the padded batch exactly.

    Trainer runs with use_cache=False; with a KV cache transformers does not detect packing (see arguments.py)."""
    tiny_model.eval()
    padded = build_collator("padded", qwen_style_tokenizer)(samples)
    flat = build_collator("padding_free", qwen_style_tokenizer)(samples)
    with torch.no_grad():
        loss_padded = tiny_model(**padded, use_cache=False).loss
        loss_flat = tiny_model(**flat, use_cache=False).loss
    torch.testing.assert_close(loss_flat, loss_padded, rtol=1e-5, atol=1e-5)


class _HandRolledAttentionLM(torch.nn.Module):
    """A model outside transformers' masking utilities, which cannot keep packed sequences apart."""

    class config:  # noqa: N801 - mimics a model config
        _attn_implementation = "sdpa"


def test_padding_free_refused_where_attention_cannot_separate_sequences(tiny_model):
    assert supports_padding_free(tiny_model)
    assert not supports_padding_free(_HandRolledAttentionLM())
    with pytest.raises(ValueError, match="--batching padded"):
        check_model_batching("padding_free", _HandRolledAttentionLM())
    check_model_batching("padded", _HandRolledAttentionLM())
    check_model_batching("packed", tiny_model)


def test_length_grouped_order_depends_on_seed_and_epoch_only():
    """Every rank (and a resumed run) must draw the same order whatever the global RNG has done meanwhile."""
    from hf_lora_ds.data.batches.collator import LengthGroupedEpochSampler

    lengths = [(7 * i) % 31 + 1 for i in range(64)]
    sampler = LengthGroupedEpochSampler(4, lengths, seed=3)
    first = list(sampler)
    torch.rand(1000)  # what dropout does to the global RNG between epochs
    assert list(sampler) == first and sorted(first) == list(range(64))
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first and list(LengthGroupedEpochSampler(4, lengths, seed=3)) == first
    sampler.set_epoch(1)
    assert list(sampler) == second

    def spread(order):  # mean longest - shortest length within a batch of 4
        return (
            sum(
                max(lengths[j] for j in order[i : i + 4]) - min(lengths[j] for j in order[i : i + 4])
                for i in range(0, 64, 4)
            )
            / 16
        )

    assert spread(first) < spread(torch.randperm(64, generator=torch.Generator().manual_seed(0)).tolist()) / 2


def test_sequence_parallel_batches_carry_positions_and_split_evenly(qwen_style_tokenizer, samples):
    """Ulysses needs position_ids, a length divisible by its size and padding on the right (it drops the attention
    mask, and causal attention never looks right); padding-free batches become one such row."""
    longest = max(len(s["input_ids"]) for s in samples)
    batch = build_collator("padded", qwen_style_tokenizer, sequence_parallel_size=4)(samples)
    assert batch["input_ids"].shape == (3, -(-longest // 4) * 4) and "attention_mask" not in batch
    for row, sample in enumerate(samples):
        n = len(sample["input_ids"])
        assert batch["input_ids"][row, :n].tolist() == sample["input_ids"]
        assert batch["position_ids"][row, :n].tolist() == list(range(n))
        assert (batch["input_ids"][row, n:] == qwen_style_tokenizer.pad_token_id).all()
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all()
    flat = build_collator("padding_free", qwen_style_tokenizer, sequence_parallel_size=4)(samples)
    total = sum(len(s["input_ids"]) for s in samples)
    assert flat["input_ids"].shape == (1, -(-total // 4) * 4)
    assert (flat["position_ids"][0] == 0).sum() == len(samples) + (total % 4 != 0)  # the samples, then the padding


def test_packing_refused_where_attention_cannot_separate_sequences():
    with pytest.raises(ValueError, match="cannot keep packed sequences apart"):
        check_model_batching("packed", _HandRolledAttentionLM())

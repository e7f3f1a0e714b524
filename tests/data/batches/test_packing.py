"""Packed rows: best-fit-decreasing into rows of max_length, every sample whole, and each sample's logits in a
packed row equal to its logits alone (eager and sdpa: no sample sees another)."""

from __future__ import annotations

import random

import pytest
import torch

from hf_lora_ds._testing.tiny_models import build_tiny_qwen2
from hf_lora_ds.data.batches.collator import build_collator
from hf_lora_ds.data.batches.packing import PackedCollator, PackedDataset, best_fit_decreasing, padding_segments
from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset
from hf_lora_ds.resources import DEMO_DATA, DEMO_MODEL

RECORDS = [
    {"instruction": f"{x}=", "output": "王大丫丫的回答是--->" + " + ".join(str(d) for d in range(x % 7 + 1))}
    for x in range(40)
] + [
    {
        "messages": [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Bonjour!"},
            {"role": "user", "content": "Tell me a joke about cats."},
            {"role": "assistant", "content": "cats."},
        ]
    }
]


@pytest.fixture
def samples(qwen_style_tokenizer, tmp_path):
    return ChatSFTDataset(RECORDS, qwen_style_tokenizer, max_length=96, cache_dir=tmp_path)


def test_best_fit_decreasing_places_every_sample_whole_within_capacity():
    rng = random.Random(0)
    lengths = [rng.randint(1, 100) for _ in range(500)] + [150]  # one longer than a row: alone in its own
    rows = best_fit_decreasing(lengths, capacity=128)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert [len(lengths) - 1] in rows
    assert all(sum(lengths[i] for i in row) <= 128 for row in rows if row != [len(lengths) - 1])
    # Best fit: no two rows could have been one, and the total is within one row of the lower bound.
    totals = sorted(sum(lengths[i] for i in row) for row in rows if row != [len(lengths) - 1])
    assert totals[0] + totals[1] > 128
    assert len(rows) - 1 <= -(-sum(lengths[:-1]) // 128) + 1


def test_best_fit_picks_the_tightest_row():
    # After 8 and 6 the rows have 2 and 4 free: the 4 fills the second exactly, the 2 the first.
    assert best_fit_decreasing([8, 6, 4, 2], capacity=10) == [[0, 3], [1, 2]]


def test_packed_rows_hold_whole_samples_with_restarting_positions(samples):
    packed = PackedDataset(samples, capacity=96)
    assert sorted(i for row in packed.rows for i in row) == list(range(len(samples)))
    row = packed[0]
    pieces, start = [], 0
    for index in packed.rows[0]:
        sample = samples[index]
        n = len(sample["input_ids"])
        assert row["input_ids"][start : start + n] == sample["input_ids"]
        assert row["position_ids"][start : start + n] == list(range(n))
        assert row["labels"][start] == IGNORE_INDEX and row["labels"][start + 1 : start + n] == sample["labels"][1:]
        pieces.append(n)
        start += n
    assert len(row["input_ids"]) == sum(pieces) == packed.lengths[0] <= 96


def test_collator_pads_rows_with_a_padding_sample_and_masks_each_first_label(samples, qwen_style_tokenizer):
    packed = PackedDataset(samples, capacity=96)
    batch = build_collator("packed", qwen_style_tokenizer, sequence_parallel_size=2, pad_to_multiple_of=3)(
        [packed[0], packed[len(packed) - 1]]
    )
    width = batch["input_ids"].shape[1]
    assert width % 6 == 0 and "attention_mask" not in batch
    assert (batch["labels"][batch["position_ids"] == 0] == IGNORE_INDEX).all()
    short = len(packed[len(packed) - 1]["input_ids"])
    pad = width - short
    assert batch["position_ids"][1, short:].tolist() == list(range(pad))
    assert (batch["input_ids"][1, short:] == qwen_style_tokenizer.pad_token_id).all()
    assert padding_segments(batch["input_ids"], batch["position_ids"], qwen_style_tokenizer.pad_token_id).tolist() == [
        width - len(packed[0]["input_ids"]),
        pad,
    ]


def test_padding_segments_in_sequence_parallel_shards():
    """A shard holding only the tail of the padding (no position 0) is all padding; a shard of a sample is none."""
    ids = torch.tensor([[5, 6, 7, 8, 0, 0, 0, 0]])
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])
    assert padding_segments(ids, positions, 0).tolist() == [4]
    assert padding_segments(ids[:, 4:], positions[:, 4:] + 4, 0).tolist() == [4]  # tail shard, positions 4..7
    assert padding_segments(ids[:, :4], positions[:, :4], 0).tolist() == [0]
    assert padding_segments(ids, positions, None).tolist() == [0]


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("one_row", [False, True], ids=["rows", "one-row"])
def test_packed_logits_equal_each_sample_alone(qwen_style_tokenizer, tmp_path, attention, one_row):
    """Every token of every sample, in a packed batch (rows padded to a multiple of 8, or flattened into one row as
    for flash attention), gets the logits it gets in a forward of that sample alone."""
    model = build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=2).eval()
    model.set_attn_implementation(attention)
    samples = ChatSFTDataset(RECORDS[:5] + RECORDS[-2:], qwen_style_tokenizer, cache_dir=tmp_path)
    packed = PackedDataset(samples, capacity=160)
    assert len(packed) < len(samples) and len(packed) > 1  # rows of several samples, and several rows
    rows = [packed[i] for i in range(len(packed))]
    batch = build_collator("packed", qwen_style_tokenizer, pad_to_multiple_of=8, one_row=one_row)(rows)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        offset, row = 0, 0
        for row_index, row_samples in enumerate(packed.rows):
            if not one_row:
                offset, row = 0, row_index
            for index in row_samples:
                ids = torch.tensor([samples[index]["input_ids"]])
                alone = model(input_ids=ids, use_cache=False).logits[0]
                torch.testing.assert_close(logits[row, offset : offset + ids.shape[1]], alone, rtol=1e-5, atol=1e-5)
                offset += ids.shape[1]


def test_packing_the_demo_data_fills_its_rows(tmp_path):
    """The bundled demo (2,520 sum-to-x samples of 30-33 tokens) in rows of 512: the rows are nearly full, and the
    batches the collator makes waste under 2% of their tokens on padding. (The demo's samples are so alike that
    batches of single samples would pad little too: the rows' fill is what shows they were packed.)"""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    packed = PackedDataset(
        ChatSFTDataset(str(DEMO_DATA / "train.json"), tokenizer, max_length=512, cache_dir=tmp_path), 512
    )
    collate = PackedCollator(tokenizer.pad_token_id)
    real = padded = 0
    for start in range(0, len(packed), 4):
        batch = collate([packed[i] for i in range(start, min(start + 4, len(packed)))])
        padded += batch["input_ids"].numel()
        real += batch["input_ids"].numel() - int(
            padding_segments(batch["input_ids"], batch["position_ids"], tokenizer.pad_token_id).sum()
        )
    assert real == sum(packed.samples.lengths)
    assert real / padded >= 0.98, real / padded
    assert packed.fill() >= 0.96 and len(packed) == 167  # 15 or 16 samples a row

"""hf_lora_ds.training.batches: what ``--batching`` makes of the datasets and the collator given to the trainer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hf_lora_ds.config.engine import Engine
from hf_lora_ds.data.batches.collator import build_collator
from hf_lora_ds.data.batches.packing import PackedCollator, PackedDataset
from hf_lora_ds.data.dataset import ChatSFTDataset
from hf_lora_ds.training.batches import prepare_batches

RECORDS = [{"instruction": f"{x}=", "output": f"{x - 3} + 3"} for x in range(10, 26)]


def _args(batching: str) -> SimpleNamespace:
    return SimpleNamespace(batching=batching, max_length=128, pad_to_multiple_of=None, engine=Engine())


@pytest.fixture
def dataset(qwen_style_tokenizer, tmp_path):
    return ChatSFTDataset(RECORDS, qwen_style_tokenizer, cache_dir=tmp_path)


def test_packed_packs_train_and_eval_and_builds_the_row_collator(tiny_model, qwen_style_tokenizer, dataset):
    train, evaluation, collator = prepare_batches(
        _args("packed"), tiny_model, dataset, {"a": dataset}, None, qwen_style_tokenizer
    )
    assert isinstance(train, PackedDataset) and isinstance(evaluation["a"], PackedDataset)
    assert len(train) < len(dataset) and isinstance(collator, PackedCollator)
    assert prepare_batches(_args("packed"), tiny_model, train, None, None, qwen_style_tokenizer)[0] is train


def test_what_is_given_is_kept(tiny_model, qwen_style_tokenizer, dataset):
    given = build_collator("padded", qwen_style_tokenizer)
    assert prepare_batches(_args("padded"), tiny_model, dataset, None, given, qwen_style_tokenizer) == (
        dataset,
        None,
        given,
    )


def test_packing_needs_the_samples_lengths(tiny_model, qwen_style_tokenizer):
    with pytest.raises(ValueError, match="the training dataset \\(list\\) has no 'lengths'"):
        prepare_batches(_args("packed"), tiny_model, [{"input_ids": [1]}], None, None, qwen_style_tokenizer)


def test_padding_needs_the_tokenizer(tiny_model, dataset):
    with pytest.raises(ValueError, match="pass processing_class"):
        prepare_batches(_args("padded"), tiny_model, dataset, None, None, None)


def test_the_collator_shards_evenly_over_the_engines_sequence_parallel_group(tiny_model, qwen_style_tokenizer, dataset):
    """Ulysses splits each row over the group: right-padded to a multiple of its size, positions given, no mask."""
    args = SimpleNamespace(**{**vars(_args("padded")), "engine": Engine("deepspeed", sequence_parallel=4)})
    collator = prepare_batches(args, tiny_model, dataset, None, None, qwen_style_tokenizer)[2]
    batch = collator([dataset[i] for i in range(3)])
    assert batch["input_ids"].shape[1] % 4 == 0 and "position_ids" in batch and "attention_mask" not in batch


def test_auto_settles_on_padded_for_a_hybrid_and_stays_padding_free_for_attention(qwen_style_tokenizer, tiny_model):
    """``--batching auto`` with flash attention resolves to padding-free before the model is known; once its layers
    are, a hybrid is padded rather than refused (an attention-only model keeps padding-free)."""
    from hf_lora_ds._testing.tiny_hybrids import build_tiny_hybrid
    from hf_lora_ds.training.batches import settle_batching

    def auto() -> SimpleNamespace:
        return SimpleNamespace(batching="padding_free", batching_asked="auto", attn_implementation="flash_attention_2")

    args = auto()
    settle_batching(args, build_tiny_hybrid("bamba", qwen_style_tokenizer))
    assert args.batching == "padded"
    args = auto()
    settle_batching(args, tiny_model)
    assert args.batching == "padding_free"


@pytest.mark.parametrize("batching", ["padding_free", "packed"])
def test_varlen_attention_gets_the_sample_bounds_in_one_row(
    batching, tiny_model, qwen_style_tokenizer, dataset, varlen_attention
):
    """``varlen_attn`` reads ``cu_seq_lens`` and the maxima (as Python ints), not the position ids; padded batches
    carry none (the kernel refuses them)."""
    tiny_model.set_attn_implementation(varlen_attention)
    collator = prepare_batches(_args(batching), tiny_model, dataset, None, None, qwen_style_tokenizer)[2]
    features = [dataset[i] for i in range(3)] if batching == "padding_free" else [PackedDataset(dataset, 128)[0]]
    batch = collator(features)
    assert batch["input_ids"].shape[0] == 1 and batch["cu_seq_lens_q"].tolist()[-1] == batch["input_ids"].shape[1]
    assert isinstance(batch["max_length_q"], int) and isinstance(batch["max_length_k"], int)
    padded = prepare_batches(_args("padded"), tiny_model, dataset, None, None, qwen_style_tokenizer)[2]
    assert "cu_seq_lens_q" not in padded(features if batching == "padding_free" else [dataset[0]])


def test_packed_batches_carry_the_boundaries_a_hybrid_s_kernels_read(qwen_style_tokenizer, dataset):
    """Where the kernels take boundaries (hf_lora_ds.model.packed_boundaries), the packed rows come as one row with
    the ``seq_idx`` and ``cu_seq_lens`` of their samples, as DataCollatorWithFlattening makes them."""
    packed = PackedDataset(dataset, 64)
    collate = build_collator("packed", qwen_style_tokenizer, boundary_keys=("seq_idx", "cu_seq_lens_q"))
    batch = collate([packed[0], packed[1]])
    lengths = [len(dataset[i]["input_ids"]) for i in packed.rows[0] + packed.rows[1]]
    assert batch["input_ids"].shape == (1, sum(lengths))
    assert batch["seq_idx"].tolist() == [[n for n, length in enumerate(lengths) for _ in range(length)]]
    assert batch["cu_seq_lens_q"].tolist() == [sum(lengths[:n]) for n in range(len(lengths) + 1)]
    assert batch["max_length_q"] == max(lengths)
    flat = build_collator("padding_free", qwen_style_tokenizer, boundary_keys=("seq_idx",))([dataset[0], dataset[1]])
    assert flat["seq_idx"].tolist() == [[0] * len(dataset[0]["input_ids"]) + [1] * len(dataset[1]["input_ids"])]

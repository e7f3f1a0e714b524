"""hf_lora_ds.config.batching: ``--batching auto`` resolved once, by the attention kernel the flags name."""

from __future__ import annotations

import pytest

from hf_lora_ds.config.batching import is_flash_attention, resolve_batching


@pytest.mark.parametrize(
    ("batching", "attention", "resolved"),
    [
        ("auto", None, "padded"),
        ("auto", "sdpa", "padded"),
        ("auto", "eager", "padded"),
        ("auto", "flash_attention_2", "padding_free"),
        ("auto", "flash_attention_3", "padding_free"),
        ("auto", "varlen_attn", "padding_free"),
        ("packed", "sdpa", "packed"),
        ("padded", "flash_attention_2", "padded"),
        ("padding_free", None, "padding_free"),
    ],
)
def test_auto_is_padding_free_with_flash_attention_only(batching, attention, resolved):
    assert resolve_batching(batching, attention) == resolved
    assert resolve_batching(resolved, attention) == resolved  # resolving again changes nothing


def test_the_attention_kind():
    assert [
        name
        for name in (None, "sdpa", "eager", "flash_attention_2", "kernels-community/flash-attn", "varlen_attn")
        if is_flash_attention(name)
    ] == ["flash_attention_2", "kernels-community/flash-attn", "varlen_attn"]


def test_the_run_s_arguments_hold_batching_resolved(tmp_path):
    """The planner and the trainer read one value: auto is resolved when the arguments are built."""
    from hf_lora_ds.config import SFTTrainingArguments

    (tmp_path / "train.json").write_text("[]")
    build = dict(output_dir=str(tmp_path), model_name_or_path="m", train_file=str(tmp_path / "train.json"))
    args = SFTTrainingArguments(**build)
    assert (args.batching, args.train_sampling_strategy) == ("padded", "group_by_length")
    assert SFTTrainingArguments(**build, batching="packed").batching == "packed"


@pytest.mark.parametrize("attention", [None, "sdpa", "flash_attention_2"])
def test_auto_is_padded_for_a_model_with_layers_besides_attention(attention):
    """Linear-attention, state-space and short-convolution layers need kernels to keep flattened samples apart
    (hf_lora_ds.model.packed_boundaries): auto never flattens for them, even with flash attention."""
    assert resolve_batching("auto", attention, sequence_mixers=True) == "padded"
    assert resolve_batching("packed", attention, sequence_mixers=True) == "packed"  # asked for: refused elsewhere

"""Batched generation equals one-by-one generation, stops at the end of the turn, and leaves its inputs alone."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from peft import LoraConfig, get_peft_model

from hf_lora_ds._testing.tiny_hybrids import HYBRID_FAMILIES, build_tiny_hybrid
from hf_lora_ds.eval import generate, stop_token_ids
from hf_lora_ds.eval.generation import (
    CHUNKED_HEAD_MIN_ROWS,
    _decode,
    _swap_in_chunked_head,
    _VocabularyChunkedHead,
)


def render(tokenizer, records):
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": r["instruction"]}], tokenize=False, add_generation_prompt=True
        )
        for r in records
    ]


def reference_generate(model, tokenizer, prompt: str, max_new_tokens: int) -> list[int]:
    """Plain transformers generate on one unpadded prompt: the ground truth batching must reproduce."""
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=stop_token_ids(tokenizer, model),
        pad_token_id=tokenizer.pad_token_id,
    )
    return out[0, ids.shape[1] :].tolist()


def test_batched_equals_one_by_one(varied_model, qwen_style_tokenizer, sum_records):
    tokenizer = qwen_style_tokenizer
    prompts = render(tokenizer, sum_records)
    lengths = {len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts}
    assert len(lengths) >= 3, "prompts of different lengths are needed to exercise left padding"
    padding_side = tokenizer.padding_side

    one_by_one = generate(varied_model, tokenizer, prompts, batch_size=1, max_new_tokens=12)
    batched = generate(varied_model, tokenizer, prompts, batch_size=5, max_new_tokens=12)
    assert batched == one_by_one
    assert len({g.text for g in batched}) >= len(prompts) // 2, "outputs barely differ: the test would miss a swap"
    assert any(g.stopped for g in batched) and not all(g.stopped for g in batched)
    assert tokenizer.padding_side == padding_side

    for prompt, g in zip(prompts, batched):
        tokens = reference_generate(varied_model, tokenizer, prompt, 12)
        assert g.num_tokens == len(tokens)
        assert g.stopped == (tokens[-1] == tokenizer.eos_token_id)
        expected = tokenizer.decode(tokens[:-1] if g.stopped else tokens, skip_special_tokens=False)
        assert g.text == expected


def test_a_model_trained_with_varlen_attention_generates_under_sdpa(
    varied_model, qwen_style_tokenizer, sum_records, varlen_attention
):
    """``varlen_attn`` reads the bounds of padding-free batches, which generation's left-padded, cached batches do
    not carry: generation runs the same weights under sdpa, and the model gets its training kernel back."""
    prompts = render(qwen_style_tokenizer, sum_records)
    expected = generate(varied_model, qwen_style_tokenizer, prompts, batch_size=5, max_new_tokens=8)
    peft_model = get_peft_model(varied_model, LoraConfig(r=2, target_modules=["q_proj"]))
    peft_model.get_base_model().set_attn_implementation(varlen_attention)
    assert generate(peft_model, qwen_style_tokenizer, prompts, batch_size=5, max_new_tokens=8) == expected
    assert peft_model.get_base_model().config._attn_implementation == varlen_attention


def test_the_shared_prefix_is_computed_once_and_each_row_computes_its_own_tokens(
    varied_model, qwen_style_tokenizer, sum_records
):
    tokenizer = qwen_style_tokenizer
    prompts = render(tokenizer, sum_records[:6])
    encoded = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    shared = next(i for i in range(len(encoded[0])) if len({tuple(ids[: i + 1]) for ids in encoded}) > 1)
    assert shared > 5, "the chat template's system prompt and header start every prompt"
    embedded = []
    hook = varied_model.get_input_embeddings().register_forward_hook(
        lambda module, inputs, output: embedded.append(tuple(inputs[0].shape))
    )
    try:
        generate(varied_model, tokenizer, prompts, batch_size=3, max_new_tokens=2)
    finally:
        hook.remove()
    own = sorted((len(ids) - shared for ids in encoded), reverse=True)  # batches are taken longest first
    assert embedded[0] == (1, shared)  # the prefix, once for the whole call
    prefills = [shape for shape in embedded[1:] if shape[1] > 1]
    assert prefills == [(3, own[0]), (3, own[3])]  # each batch: only its rows' own tokens, left-padded


def test_beam_search_gets_no_shared_prefix_and_still_equals_one_by_one(varied_model, qwen_style_tokenizer, sum_records):
    prompts = render(qwen_style_tokenizer, sum_records[:4])
    beams = generate(varied_model, qwen_style_tokenizer, prompts, batch_size=4, max_new_tokens=4, num_beams=2)
    assert beams == generate(varied_model, qwen_style_tokenizer, prompts, batch_size=1, max_new_tokens=4, num_beams=2)


def test_generate_restores_training_mode(varied_model, qwen_style_tokenizer):
    varied_model.train()
    prompts = render(qwen_style_tokenizer, [{"instruction": "3="}])
    generate(varied_model, qwen_style_tokenizer, prompts, max_new_tokens=2)
    assert varied_model.training


def test_decode_cuts_at_the_first_stop_and_keeps_other_special_tokens(qwen_style_tokenizer):
    tok = qwen_style_tokenizer
    im_start, im_end, pad = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    text_ids = tok("12", add_special_tokens=False)["input_ids"]
    g = _decode(tok, text_ids + [im_start, im_end, pad, pad], [im_end])
    assert (g.text, g.num_tokens, g.stopped) == ("12<|im_start|>", len(text_ids) + 2, True)
    g = _decode(tok, text_ids, [im_end])
    assert (g.text, g.num_tokens, g.stopped) == ("12", len(text_ids), False)


def test_stop_tokens_include_the_template_end_of_turn(qwen_style_tokenizer, tiny_model):
    im_end, endoftext = qwen_style_tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    base_style = copy.deepcopy(qwen_style_tokenizer)
    base_style.eos_token = "<|endoftext|>"  # as a Qwen base model's tokenizer has it
    tiny_model.generation_config.eos_token_id = endoftext
    assert stop_token_ids(base_style, tiny_model) == [im_end, endoftext]


def test_batch_size_must_be_positive(varied_model, qwen_style_tokenizer):
    with pytest.raises(ValueError, match="batch_size"):
        generate(varied_model, qwen_style_tokenizer, ["x"], batch_size=0)


def test_the_chunked_head_gives_the_head_s_logits(varied_model, monkeypatch):
    head = varied_model.get_output_embeddings()
    # the package's ``generate`` function hides its module's name
    monkeypatch.setattr(
        importlib.import_module("hf_lora_ds.eval.generation"), "VOCABULARY_CHUNK", 48
    )  # not a divisor: the last slice is short
    assert head.weight.shape[0] > 3 * 48 and head.weight.shape[0] % 48
    hidden = torch.randn(2, CHUNKED_HEAD_MIN_ROWS, head.in_features)
    assert torch.equal(_VocabularyChunkedHead(head)(hidden), head(hidden))
    with_bias = torch.nn.Linear(head.in_features, head.out_features)
    assert torch.equal(_VocabularyChunkedHead(with_bias)(hidden), with_bias(hidden))


def test_a_cpu_batch_generates_through_the_chunked_head_and_gets_its_head_back(
    varied_model, qwen_style_tokenizer, sum_records
):
    head = varied_model.get_output_embeddings()
    rows_through_the_head = []
    hook = head.register_forward_hook(lambda module, inputs, output: rows_through_the_head.append(len(inputs[0])))
    prompts = render(qwen_style_tokenizer, sum_records)
    try:
        generate(varied_model, qwen_style_tokenizer, prompts, batch_size=CHUNKED_HEAD_MIN_ROWS + 1, max_new_tokens=3)
    finally:
        hook.remove()
    # the first batch's rows go through the slices, never the head itself; the last batch, under the minimum, does,
    # and so does the shared prefix's one kept position (one row)
    assert rows_through_the_head[0] == 1
    assert set(rows_through_the_head[1:]) == {len(prompts) - CHUNKED_HEAD_MIN_ROWS - 1}
    assert varied_model.get_output_embeddings() is head


def test_the_head_is_left_alone_where_a_hook_owns_its_weights(varied_model):
    head = varied_model.get_output_embeddings()
    head.weight.ds_id = 0  # as DeepSpeed ZeRO-3 marks a partitioned parameter
    try:
        assert _swap_in_chunked_head(varied_model) is None
    finally:
        del head.weight.ds_id
    assert varied_model.get_output_embeddings() is head


@pytest.mark.parametrize("synced_gpus", [False, True], ids=["shared-prefix", "synced"])
def test_fsdp2_sharded_model_generates_as_one_by_one(varied_model, qwen_style_tokenizer, sum_records, synced_gpus):
    """FSDP2 as accelerate applies it (each decoder layer, then the root: the PEFT model) on a one-process gloo group,
    after a training step resharded everything. The shared-prefix forward and ``generate`` must pass the root's hooks,
    which gather the embeddings, final norm and head (an inner module's call sees them sharded: DTensor errors)."""
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import fully_shard

    tokenizer = qwen_style_tokenizer
    prompts = render(tokenizer, sum_records[:6])
    model = get_peft_model(varied_model, LoraConfig(r=4, target_modules="all-linear"))
    expected = generate(model, tokenizer, prompts, batch_size=1, max_new_tokens=8)
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    ids = torch.tensor([tokenizer(prompts[0], add_special_tokens=False)["input_ids"]])
    model(input_ids=ids, labels=ids).loss.backward()  # leaves every parameter group resharded

    assert generate(model, tokenizer, prompts, batch_size=4, max_new_tokens=8, synced_gpus=synced_gpus) == expected
    assert type(model.get_input_embeddings().weight).__name__ == "DTensor", "the root's weights are sharded again"


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_hybrid_models_batched_answers_equal_one_by_one_with_no_padding(family, qwen_style_tokenizer):
    """Linear-attention, state-space and short-convolution layers carry a state that padding between the shared
    prefix and a row's tokens would change (and transformers cannot copy their prefix cache for a batch): their
    prompts are batched by equal length, unpadded, and answer as each prompt alone does."""
    tokenizer = qwen_style_tokenizer
    model = build_tiny_hybrid(family, tokenizer)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # varied weights: answers that differ from prompt to prompt (all but Qwen3.5's and LFM2's)
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator))
    questions = ["12=", "34=", "56=", "78=", "Tell me a joke about cats.", "Tell me a joke about dogs.", "hello", "x"]
    prompts = render(tokenizer, [{"instruction": question} for question in questions])
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    prefills = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda module, inputs, output: prefills.append(tuple(inputs[0].shape)) if inputs[0].shape[1] > 1 else None
    )
    try:
        batched = generate(model, tokenizer, prompts, batch_size=3, max_new_tokens=6)
    finally:
        hook.remove()
    by_length = sorted(set(lengths), reverse=True)
    expected = [(min(3, lengths.count(n) - start), n) for n in by_length for start in range(0, lengths.count(n), 3)]
    assert prefills == expected  # whole prompts, rows of one length: no padding, no shared prefix
    assert any(rows > 1 for rows, _ in prefills)
    for prompt, answer in zip(prompts, batched):
        tokens = reference_generate(model, tokenizer, prompt, 6)
        expected_text = tokenizer.decode(tokens[:-1] if answer.stopped else tokens, skip_special_tokens=False)
        assert (answer.text, answer.num_tokens) == (expected_text, len(tokens))

"""GGUF out: merged Llama / Qwen2 models written as GGUF files that load back with the same logits (within the
format's precision), the same prompt ids and the same chat template; a GGUF base tuned and exported again."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import run_sft
from hf_lora_ds._testing.tiny_models import build_tiny_causal_lm
from hf_lora_ds.cli.merge import main as merge_main
from hf_lora_ds.errors import MissingPathError
from hf_lora_ds.model.gguf_export import export_gguf
from hf_lora_ds.model.gguf_import import model_source, plain_model

gguf = pytest.importorskip("gguf", reason="GGUF support needs the gguf package: pip install 'hf_lora_ds[gguf]'")

MESSAGES = [{"role": "user", "content": "What is the capital of France? 12 + 30"}]
# Max |logit difference| allowed, as a fraction of the largest |logit|: F32 is exact (a wrong q/k layout is not),
# the others round every weight (Q8_0: 8-bit values with one scale per 32).
TOLERANCE = {"f32": 1e-5, "f16": 1e-2, "bf16": 5e-2, "q8_0": 1e-1}


def _load(path, **kwargs):
    source, source_kwargs = model_source(str(path), **kwargs)
    model = plain_model(AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **source_kwargs)).eval()
    return model, AutoTokenizer.from_pretrained(source, **source_kwargs)


@pytest.mark.parametrize("outtype", list(TOLERANCE))
def test_exported_gguf_loads_back_with_the_same_logits_ids_and_template(tiny_dir, outtype, tmp_path):
    out = export_gguf(tiny_dir, tmp_path / f"model-{outtype}.gguf", outtype)  # alone in its directory: no HF files
    reference, tokenizer = _load(tiny_dir)
    loaded, loaded_tokenizer = _load(out)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    loaded_ids = loaded_tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert torch.equal(loaded_ids["input_ids"], ids["input_ids"])
    with torch.no_grad():
        expected, got = reference(**ids).logits, loaded(**ids).logits
    assert (got - expected).abs().max() <= TOLERANCE[outtype] * expected.abs().max(), outtype


def test_the_files_metadata_read_back_with_gguf(tiny_dir, tmp_path):
    """What llama.cpp reads and transformers' loader does not check: the special token ids (an EOS left out loads
    with ``eos_token None``: generation never stops), F32 for every 1-D tensor whatever the outtype, the template."""
    reader = gguf.GGUFReader(export_gguf(tiny_dir, tmp_path / "model.gguf", "f16"))
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    keys = gguf.Keys.Tokenizer
    for kind, key in (("bos", keys.BOS_ID), ("eos", keys.EOS_ID), ("pad", keys.PAD_ID)):
        field = reader.fields.get(key)
        assert (field.contents() if field else None) == getattr(tokenizer, f"{kind}_token_id"), kind
    assert tokenizer.eos_token_id is not None and tokenizer.pad_token_id is not None
    assert reader.fields[gguf.Keys.Tokenizer.CHAT_TEMPLATE].contents() == tokenizer.chat_template
    types = {tensor.name: (len(tensor.shape), tensor.tensor_type.name) for tensor in reader.tensors}
    assert {kind for dims, kind in types.values() if dims == 1} == {"F32"}, types
    assert {kind for dims, kind in types.values() if dims == 2} == {"F16"}, types


def test_gguf_base_to_tuned_gguf_with_run_sft_and_merge(qwen_style_tokenizer, tmp_path):
    model_dir = tmp_path / "hf"
    build_tiny_causal_lm("qwen2", qwen_style_tokenizer).save_pretrained(model_dir)
    qwen_style_tokenizer.save_pretrained(model_dir)
    base = export_gguf(model_dir, tmp_path / "base.gguf", "q8_0")
    records = [{"instruction": f"{x}=", "input": "", "output": f"{x - 2} + 2"} for x in range(10, 26)]
    (tmp_path / "train.json").write_text(json.dumps(records))
    flags = [
        "--train_file",
        str(tmp_path / "train.json"),
        "--eval_file",
        "",
        "--output_dir",
        str(tmp_path / "out"),
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--dataset_cache_dir",
        str(tmp_path / "c"),
    ]
    run_sft.main(["--model_name_or_path", str(tmp_path), "--gguf_file", base.name, *flags])
    # docs/lora.md's second GGUF command: merge onto the GGUF base, write the tuned model as GGUF too.
    merged = tmp_path / "tuned" / "model.gguf"
    assert (
        merge_main(
            [
                "--model_name_or_path",
                str(base),
                "--adapter",
                str(tmp_path / "out"),
                "--out",
                str(tmp_path / "merged"),
                "--gguf",
                str(merged),
                "--gguf_type",
                "f32",
            ]
        )
        == 0
    )
    (expected, tokenizer), (got, _) = _load(tmp_path / "merged"), _load(merged)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        torch.testing.assert_close(got(**ids).logits, expected(**ids).logits)
    with pytest.raises(MissingPathError, match="--gguf_file other.gguf"):
        run_sft.main(["--model_name_or_path", str(tmp_path), "--gguf_file", "other.gguf", *flags])


def test_only_llama_and_qwen2_are_written_a_moe_model_is_named_so(qwen_style_tokenizer, tiny_dir):
    from hf_lora_ds._testing.tiny_models import build_tiny_moe
    from hf_lora_ds.errors import UserError
    from hf_lora_ds.model.gguf_export import check_gguf_architecture

    check_gguf_architecture(AutoModelForCausalLM.from_pretrained(tiny_dir).config, tiny_dir)
    with pytest.raises(UserError, match=r"^--gguf: DIR is a mixtral model \(a Mixture-of-Experts model: its experts"):
        check_gguf_architecture(build_tiny_moe("mixtral", qwen_style_tokenizer).config, "DIR")

"""merge_adapter: the merged model computes what base + adapter computed, within the tolerance, or the merge is
refused."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_lora_ds._testing.tiny_models import build_tiny_moe
from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.model.lora import lora_config_from_args, wrap_with_lora
from hf_lora_ds.model.merge_adapter import MergeMismatchError, merge_adapter
from tests import REPO


def test_tolerance_is_enforced(tiny_model_dir, trained_adapter, tmp_path):
    """bf16 rounding makes merged and unmerged differ; an impossibly tight tolerance must be reported."""
    with pytest.raises(MergeMismatchError, match="differs from base \\+ adapter"):
        merge_adapter(tiny_model_dir, trained_adapter, tmp_path / "bf16", dtype="bfloat16", atol=1e-9)


def test_the_bundled_adapter_merges_with_the_default_tolerance(tmp_path):
    """A trained model's logits reach ~20; fp32 rounding of the reordered arithmetic then exceeds 1e-4 absolute
    (measured 2.1e-4 on the bundled adapter), so a fixed 1e-4 refused a correct merge of docs/eval.md's own adapter."""

    data = REPO / "data"
    diff = merge_adapter(data / "tiny-qwen2-sum", data / "tiny-qwen2-sum-lora", tmp_path / "merged")
    assert 0 < diff < 1e-2


def test_a_merge_that_loses_the_adapter_is_refused(tiny_model_dir, trained_adapter, tmp_path, monkeypatch):
    """The default tolerance is relative to the logits, yet still far below what a trained adapter changes."""
    from peft.tuners.lora import LoraModel

    monkeypatch.setattr(LoraModel, "merge_and_unload", LoraModel.unload)  # the base alone, the adapter dropped
    with pytest.raises(MergeMismatchError, match="differs from base \\+ adapter"):
        merge_adapter(tiny_model_dir, trained_adapter, tmp_path / "lost")


def test_a_nan_logit_on_any_prompt_is_refused_and_named(tiny_model_dir, trained_adapter, tmp_path, monkeypatch):
    """The export's logits NaN on prompt 2 only: Python's max over the prompts' differences drops a NaN that does not
    come first, and the merge passed verification (diff 2.0e-4)."""
    import hf_lora_ds.model.merge_adapter as merging

    computed = []

    def logits_nan_on_the_exports_second_prompt(*args):
        logits = merging_logits(*args)
        computed.append(logits)
        if len(computed) == 2:  # the reloaded export's
            logits[1][0, -1, 0] = float("nan")
        return logits

    merging_logits = merging._logits
    monkeypatch.setattr(merging, "_logits", logits_nan_on_the_exports_second_prompt)
    prompts = ("Hello, how can I help you today?", "What is the capital of France?", "Tell me a joke about cats.")
    with pytest.raises(MergeMismatchError, match=r"by nan \(> .*\) in logits on prompt 2 of 3 \('What is the capital"):
        merge_adapter(tiny_model_dir, trained_adapter, tmp_path / "nan", prompts=prompts)


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_a_moe_adapter_with_lora_on_the_fused_experts_merges(family, qwen_style_tokenizer, tmp_path):
    """PEFT merges a fused expert stack's adapter (ParamWrapper) into the stack; the merged export computes base +
    adapter. DeepSeek-V3's adapter (its dense first layer and shared experts adapted too) did not even load back in
    PEFT 0.21 alone ("Cannot convert PEFT target(s) up_proj without also targeting gate_proj")."""
    base = build_tiny_moe(family, qwen_style_tokenizer)
    base.save_pretrained(tmp_path / "base")
    qwen_style_tokenizer.save_pretrained(tmp_path / "base")
    model = wrap_with_lora(base, lora_config_from_args(SFTTrainingArguments.unbuilt()))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # as after training: a fresh adapter adds nothing and would hide a bad merge
                param.copy_(0.5 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(tmp_path / "adapter")
    assert merge_adapter(tmp_path / "base", tmp_path / "adapter", tmp_path / "merged") < 1e-3
    before, after = (AutoModelForCausalLM.from_pretrained(tmp_path / name) for name in ("base", "merged"))
    stack = before.model.layers[1].mlp.experts.gate_up_proj
    assert (after.model.layers[1].mlp.experts.gate_up_proj - stack).abs().max() > 1e-3  # the experts' adapter merged

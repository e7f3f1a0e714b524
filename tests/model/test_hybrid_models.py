"""Hybrid models (issue 61) with the package's defaults: every family of ``HYBRID_FAMILIES`` trains a few steps in the
package's trainer, its adapter passes the package's check, loads back in plain PEFT on a fresh base and merges to the
logits it gave; the layers a mixer's kernel reads directly are left out, or refused when named; and every MoE family's
adapter loads back in plain PEFT (PEFT's transformers-4 rewrite used to drop Qwen3-Next's shared expert)."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel

from hf_lora_ds._testing.tiny_hybrids import HYBRID_FAMILIES, build_tiny_hybrid
from hf_lora_ds._testing.tiny_models import MOE_FAMILIES, build_tiny_moe
from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.data.dataset import ChatSFTDataset
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.adapter_check import verify_adapter
from hf_lora_ds.model.layer_kinds import sequence_mixers
from hf_lora_ds.model.lora import lora_config_from_args, wrap_with_lora
from hf_lora_ds.model.lora_coverage import MIXER_KINDS, lora_coverage
from hf_lora_ds.trainer.lora_sft_trainer import LoraSFTTrainer
from tests.trainer.test_run_inputs import arguments

RECORDS = [{"instruction": f"{x}=", "output": f"{x - 3} + 3"} for x in range(10, 26)]
MOE_HYBRIDS = ("qwen3_next", "granitemoehybrid", "nemotron_h", "jamba")
IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_each_family_trains_with_the_defaults_and_its_adapter_reloads_and_merges(
    family, qwen_style_tokenizer, tmp_path
):
    args = arguments(tmp_path)
    model = build_tiny_hybrid(family, qwen_style_tokenizer)
    dataset = ChatSFTDataset(RECORDS, qwen_style_tokenizer, cache_dir=tmp_path)
    trainer = LoraSFTTrainer(model, args, train_dataset=dataset, processing_class=qwen_style_tokenizer)
    trainer.train()
    trainer.save_model()  # runs the package's adapter check (verify_adapter) on the saved files
    verify_adapter(args.output_dir, base_model=trainer.model.get_base_model().config)
    trained = logits(trainer.model)
    reloaded = PeftModel.from_pretrained(build_tiny_hybrid(family, qwen_style_tokenizer), args.output_dir)
    torch.testing.assert_close(logits(reloaded), trained)
    torch.testing.assert_close(logits(reloaded.merge_and_unload()), trained, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(logits(build_tiny_hybrid(family, qwen_style_tokenizer)), trained)  # it trained


@pytest.mark.parametrize("family", MOE_FAMILIES + MOE_HYBRIDS)
def test_every_moe_family_s_adapter_loads_back_in_plain_peft(family, qwen_style_tokenizer, tmp_path):
    """Wrapped with the demo's flags, every adapter factor set by hand (B too, so each one counts), saved: PEFT's own
    ``from_pretrained`` on a fresh base gives the same logits."""
    build = build_tiny_hybrid if family in MOE_HYBRIDS else build_tiny_moe
    model = wrap_with_lora(build(family, qwen_style_tokenizer), lora_config_from_args(SFTTrainingArguments.unbuilt()))
    torch.manual_seed(1)
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.data.normal_(0, 0.1)
    model.save_pretrained(tmp_path)
    verify_adapter(tmp_path, base_model=model.get_base_model().config)
    reloaded = PeftModel.from_pretrained(build(family, qwen_style_tokenizer), str(tmp_path))
    torch.testing.assert_close(logits(reloaded), logits(model))


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_the_layers_a_mixer_s_kernel_reads_are_never_adapted(family, qwen_style_tokenizer):
    """The depthwise convolutions, a Mamba mixer's out_proj and Jamba's dt_proj (its code multiplies by the weight
    itself): a LoRA there trains nothing or is skipped by the GPU kernel. The input projections are adapted."""
    model = wrap_with_lora(
        build_tiny_hybrid(family, qwen_style_tokenizer), lora_config_from_args(SFTTrainingArguments.unbuilt())
    )
    header = lora_coverage(model).table().splitlines()[1]  # the coverage table has a column per layer kind
    assert {kind for kind in MIXER_KINDS if kind in header} == {"attention", *sequence_mixers(model).values()}
    for mixer, kind in sequence_mixers(model).items():
        adapted = {name for name, child in model.get_submodule(mixer).named_children() if hasattr(child, "lora_A")}
        assert any(name.startswith("in_proj") for name in adapted)
        assert not adapted & {"conv1d", "conv", "dt_proj"}
        assert ("out_proj" in adapted) == (kind != "state space")


@pytest.mark.parametrize(("family", "target"), [("bamba", "out_proj"), ("jamba", "dt_proj"), ("lfm2", "conv")])
def test_a_named_kernel_read_layer_is_refused_in_one_line(family, target, qwen_style_tokenizer):
    model = build_tiny_hybrid(family, qwen_style_tokenizer)
    config = lora_config_from_args(SFTTrainingArguments.unbuilt(lora_target_modules=f"in_proj,{target}"))
    with pytest.raises(UserError, match=f"{target} names the .* whose weight the mixer's kernels read directly"):
        wrap_with_lora(model, config)

"""hf_lora_ds.model.adapter_conversion: an adapter started from the base weights (PiSSA, OLoRA) is saved as a plain
LoRA adapter that gives the trained model on the ORIGINAL base, the same file PEFT's own conversion writes; the
adapter set back to its start gives the original base again."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hf_lora_ds.model.adapter_conversion import adapter_set_to, adapter_snapshot, write_plain_adapter

IDS = torch.arange(3, 30).unsqueeze(0)


def _base(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _trained(model_dir, init: str, use_rslora: bool = False, alpha_pattern: dict | None = None):
    """The base wrapped with ``init``, its start, then every adapter tensor moved as training would move it."""
    torch.manual_seed(0)
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        use_rslora=use_rslora,
        alpha_pattern=alpha_pattern or {},
        target_modules="all-linear",
        init_lora_weights=init,
    )
    model = get_peft_model(_base(model_dir), config)
    start = adapter_snapshot(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                param.add_(0.05 * torch.randn_like(param))
    return model.eval(), start


def _close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal to fp32 rounding, relative to the logits' scale (the residual base and the converted adapter add the
    same terms in another order)."""
    return (actual - expected).abs().max().item() <= 1e-5 * expected.abs().max().item()


@pytest.mark.parametrize(("init", "use_rslora"), [("pissa", False), ("pissa_niter_2", True), ("olora", False)])
def test_the_saved_adapter_on_the_original_base_is_the_trained_model(varied_model_dir, tmp_path, init, use_rslora):
    model, start = _trained(varied_model_dir, init, use_rslora)
    trained = _logits(model)
    model.save_pretrained(tmp_path)
    assert write_plain_adapter(tmp_path, start)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (config["r"], config["init_lora_weights"]) == (8, True)
    assert config["lora_alpha"] == pytest.approx(8 * (2**0.5 if use_rslora else 2))
    assert _close(_logits(PeftModel.from_pretrained(_base(varied_model_dir), tmp_path)), trained)


@pytest.mark.parametrize("init", ["pissa", "olora"])
def test_rslora_with_an_alpha_pattern_on_the_original_base_is_the_trained_model(varied_model_dir, tmp_path, init):
    """rsLoRA scales by alpha / sqrt(r): at rank 2r a patterned module's alpha grows by sqrt(2), as the global one
    does (doubled, as PEFT's own conversion does, the patterned modules came out sqrt(2) too strong)."""
    model, start = _trained(varied_model_dir, init, use_rslora=True, alpha_pattern={"q_proj": 16})
    trained = _logits(model)
    model.save_pretrained(tmp_path)
    assert write_plain_adapter(tmp_path, start)
    assert _close(_logits(PeftModel.from_pretrained(_base(varied_model_dir), tmp_path)), trained)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["alpha_pattern"] == {"q_proj": pytest.approx(16 * 2**0.5)}


def test_an_adapter_moved_in_one_tensor_only_is_trained(varied_model_dir, tmp_path):
    """A partly trained adapter (one module's B moved, every other tensor at its start) is not "never trained"."""
    model = get_peft_model(
        _base(varied_model_dir), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights="pissa")
    )
    start = adapter_snapshot(model)
    first_b = next(param for name, param in model.named_parameters() if ".lora_B." in name)
    with torch.no_grad():
        first_b[0, 0] += 0.05
    model.save_pretrained(tmp_path)
    assert write_plain_adapter(tmp_path, start)


def test_without_the_conversion_the_adapter_misses_the_residual(varied_model_dir, tmp_path):
    """What the conversion is for: the same adapter written as trained, on the original base, is another model."""
    model, _start = _trained(varied_model_dir, "pissa")
    trained = _logits(model)
    model.save_pretrained(tmp_path)
    write_plain_adapter(tmp_path, None)  # plain config, weights as trained
    assert not _close(_logits(PeftModel.from_pretrained(_base(varied_model_dir), tmp_path)), trained)


def test_the_same_file_as_peft_s_own_conversion(varied_model_dir, tmp_path):
    model, start = _trained(varied_model_dir, "olora")
    with adapter_set_to(model, start):  # PEFT's recipe: the start saved with init True before training
        model.peft_config["default"].init_lora_weights = True
        model.save_pretrained(tmp_path / "start")
        model.peft_config["default"].init_lora_weights = "olora"
    model.save_pretrained(tmp_path / "peft", path_initial_model_for_weight_conversion=str(tmp_path / "start"))
    model.save_pretrained(tmp_path / "ours")
    write_plain_adapter(tmp_path / "ours", start)
    theirs, ours = (load_file(tmp_path / name / "adapter_model.safetensors") for name in ("peft", "ours"))
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[key], ours[key]) for key in theirs)
    configs = [json.loads((tmp_path / name / "adapter_config.json").read_text()) for name in ("peft", "ours")]
    assert [(c["r"], c["lora_alpha"], c["init_lora_weights"]) for c in configs] == [(8, 16, True)] * 2


def test_an_adapter_still_at_its_start_is_reported(varied_model_dir, tmp_path):
    model = get_peft_model(
        _base(varied_model_dir), LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights="pissa")
    )
    model.save_pretrained(tmp_path)
    assert not write_plain_adapter(tmp_path, adapter_snapshot(model))


def test_the_adapter_set_back_to_its_start_is_the_original_base(varied_model_dir):
    model, start = _trained(varied_model_dir, "pissa")
    trained = _logits(model)
    with adapter_set_to(model, start):
        assert _close(_logits(model), _logits(_base(varied_model_dir)))
    assert torch.equal(_logits(model), trained)


def test_every_variant_is_saved_with_a_plain_config(varied_model_dir, tmp_path):
    model = get_peft_model(
        _base(varied_model_dir), LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights="orthogonal")
    )
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "adapter_model.safetensors")
    assert write_plain_adapter(tmp_path, None)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["init_lora_weights"] is True
    assert all(
        torch.equal(weights[key], tensor) for key, tensor in load_file(tmp_path / "adapter_model.safetensors").items()
    )

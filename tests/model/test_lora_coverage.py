"""LoRA coverage: the table for a dense and a MoE-shaped tiny model, the stop for partial targets, the one line for a
deliberate choice, and the table in the run report."""

from __future__ import annotations

import pytest
from peft import LoraConfig
from transformers import MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

from hf_lora_ds import audit
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.lora import wrap_with_lora
from hf_lora_ds.model.lora_coverage import COVERAGE_FILE, LoraCoverage, Site, lora_coverage
from hf_lora_ds.report import write_report
from tests.trainer.test_lora_sft_trainer import make_trainer

DENSE_ALL = """\
LoRA coverage (adapted/linear modules per decoder layer):
layers   attention  mlp
0-1      4/4        3/3"""


def coverage(model, **config):
    return lora_coverage(wrap_with_lora(model, LoraConfig(r=2, **config)))


def tiny_moe(vocab_size: int = 64) -> Qwen2MoeForCausalLM:
    """2 layers of 4 fused experts and a shared expert, as Qwen2-MoE (and Qwen3-MoE) are built in transformers 5."""
    config = Qwen2MoeConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_experts=4,
        num_experts_per_tok=2,
    )
    return Qwen2MoeForCausalLM(config)


def test_dense_all_linear_and_a_deliberate_partial_choice(tiny_model):
    full = coverage(tiny_model, target_modules="all-linear")
    assert (full.table(), full.check(False, "all-linear")) == (DENSE_ALL, None)


def test_deliberate_q_v_trains_with_one_line(tiny_model):
    partial = coverage(tiny_model, target_modules=["q_proj", "v_proj"])
    assert partial.table().splitlines()[2:] == [
        "0-1      2/4        0/3",
        "left out: attention k_proj, o_proj; mlp gate_proj, up_proj, down_proj",
    ]
    assert partial.check(False, "q_proj,v_proj") == (
        "LoRA targets q_proj,v_proj leave out: attention (k_proj, o_proj); mlp (gate_proj, up_proj, down_proj)"
    )


def test_layers_left_without_adapter_stop_unless_allowed(tiny_model):
    names = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    partial = coverage(tiny_model, target_modules=names, layers_to_transform=[0])
    assert partial.table().splitlines()[2:] == ["0        4/4        3/3", "1        0/4        0/3"]
    with pytest.raises(
        UserError,
        match=r"^--lora_target_modules all-linear: LoRA adapts no module of decoder layers "
        r"1 \(of 2\), so they are not trained; target those modules, or pass "
        r"--lora_allow_partial true",
    ):
        partial.check(False, "all-linear")
    allowed = (
        "LoRA adapts no module of decoder layers 1 (of 2), so they are not trained (allowed by --lora_allow_partial)"
    )
    assert partial.check(True, "all-linear") == allowed


def test_moe_experts_skipped_by_all_linear_stop_and_targeted_experts_pass():
    skipped = coverage(tiny_moe(), target_modules="all-linear")
    assert skipped.table().splitlines()[1:] == [
        "layers   attention  mlp        experts",
        "0-1      4/4        4/4        0/1",
        "left out: experts gate_up_proj/down_proj (fused)",
    ]
    with pytest.raises(
        UserError,
        match=r"LoRA adapts the experts of 0 of the 2 MoE layers \(gate_up_proj/down_proj "
        r"\(fused\) left out\), so the experts, most of the model, are not trained",
    ):
        skipped.check(False, "all-linear")
    experts = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    targeted = coverage(tiny_moe(), target_modules="all-linear", target_parameters=experts)
    assert targeted.table().splitlines()[2] == "0-1      4/4        4/4        1/1"
    assert targeted.check(False, "all-linear") is None
    # PEFT reaches Mixtral's fused experts (and router) with all-linear on its own: nothing to stop there.
    mixtral = MixtralConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=4,
    )
    covered = coverage(MixtralForCausalLM(mixtral), target_modules="all-linear")
    assert covered.table().splitlines()[2] == "0-1      4/4        1/1        1/1"
    assert covered.check(False, "all-linear") is None


def test_trainer_prints_the_table_and_stops_on_skipped_experts(tiny_model, qwen_style_tokenizer, tmp_path, capsys):
    make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, lora_target_modules="q_proj,v_proj")
    out = capsys.readouterr().out
    assert "LoRA coverage (adapted/linear modules per decoder layer):\nlayers   attention  mlp\n0-1      2/4" in out
    assert (
        "LoRA targets q_proj,v_proj leave out: attention (k_proj, o_proj); mlp (gate_proj, up_proj, down_proj)" in out
    )
    with pytest.raises(UserError, match="LoRA adapts the experts of 0 of the 2 MoE layers"):
        make_trainer(tiny_moe(len(qwen_style_tokenizer)), qwen_style_tokenizer, tmp_path)
    make_trainer(tiny_moe(len(qwen_style_tokenizer)), qwen_style_tokenizer, tmp_path, lora_allow_partial=True)


def test_run_report_shows_the_saved_table(tmp_path):
    (tmp_path / COVERAGE_FILE).write_text(DENSE_ALL + "\n")
    html = write_report(tmp_path, []).read_text(encoding="utf-8")
    assert "<h2>LoRA coverage</h2>\n<pre>" + DENSE_ALL in html


def test_audit_shows_the_coverage_for_a_model(tiny_model_dir, tmp_path, capsys):
    (tmp_path / "data.jsonl").write_text('{"instruction": "1=", "output": "1"}\n')
    argv = ["--train_file", str(tmp_path / "data.jsonl"), "--model_name_or_path", str(tiny_model_dir)]
    audit.main([*argv, "--lora_target_modules", "q_proj,v_proj"])
    out = capsys.readouterr().out
    assert (
        "\nLoRA coverage (adapted/linear modules per decoder layer):\n"
        "layers   attention  mlp\n0-1      2/4        0/3\n" in out
    )
    assert out.rstrip().endswith(
        "LoRA targets q_proj,v_proj leave out: attention (k_proj, o_proj); mlp (gate_proj, up_proj, down_proj)"
    )


def experts_tuned_in(tuned_layers: int, moe_layers: int, layers: int = 4) -> LoraCoverage:
    """``layers`` decoder layers, attention adapted in each; the first ``moe_layers`` have experts, of which the
    first ``tuned_layers`` are adapted (a hybrid MoE, or targets matching some layers' expert names only)."""
    sites = [Site(layer, "attention", "q_proj", True) for layer in range(layers)]
    sites += [Site(layer, "experts", "w1", layer < tuned_layers) for layer in range(moe_layers)]
    return LoraCoverage(sites)


def test_experts_tuned_in_half_the_moe_layers_or_fewer_stop():
    """The rule is "most MoE layers' experts tuned", not "any": a run adapting the experts of 1 or 2 of 4 MoE layers
    leaves most of the model untrained."""
    for tuned in (1, 2):
        assert f"LoRA adapts the experts of {tuned} of the 4 MoE layers" in experts_tuned_in(tuned, 4).problem()
    assert experts_tuned_in(3, 4).problem() is None
    assert experts_tuned_in(0, 2, layers=5).problem() is None  # experts in 2 of 5 layers only: not most of the model

"""LoRA coverage: the table for a dense model and for MoE families (experts per layer, shared experts apart, the
router left alone), the stop for partial targets, the one line for a deliberate choice, and the table in the run
report."""

from __future__ import annotations

import re

import pytest
from peft import LoraConfig

from hf_lora_ds import audit
from hf_lora_ds._testing.tiny_models import build_tiny_moe
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.lora import wrap_with_lora
from hf_lora_ds.model.lora_coverage import COVERAGE_FILE, LoraCoverage, Site, lora_coverage
from hf_lora_ds.report import write_report
from tests.trainer.test_lora_sft_trainer import make_trainer

DENSE_ALL = """\
LoRA coverage (adapted/linear modules per decoder layer):
layers   attention  mlp
0-1      4/4        3/3"""


MOE_HEADER = (
    "LoRA coverage (adapted/linear modules per decoder layer; experts: routed-expert weights, a fused one once for "
    "all experts):"
)


def coverage(model, **config):
    return lora_coverage(wrap_with_lora(model, LoraConfig(r=2, **config)))


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


@pytest.mark.parametrize(
    ("family", "rows"),
    [
        ("qwen2_moe", ["layers   attention  experts    shared", "0-1      4/4        2/2        3/3"]),
        ("mixtral", ["layers   attention  experts", "0-1      4/4        2/2"]),
        (
            "deepseek_v3",
            [
                "layers   attention  mlp        experts    shared",
                "0        5/5        3/3        -          -",
                "1        5/5        -          2/2        3/3",
            ],
        ),
    ],
)
def test_moe_experts_per_layer_shared_apart_router_left_alone(family, rows, qwen_style_tokenizer):
    covered = coverage(build_tiny_moe(family, qwen_style_tokenizer), target_modules="all-linear")
    assert covered.table().splitlines() == [MOE_HEADER, *rows]
    assert covered.check(False, "all-linear") is None


def test_experts_left_out_stop_unless_left_out_on_purpose(qwen_style_tokenizer):
    skipped = coverage(build_tiny_moe("qwen3_moe", qwen_style_tokenizer), target_modules=["q_proj", "v_proj"])
    assert skipped.table().splitlines()[2:] == [
        "0-1      2/4        0/2",
        "left out: attention k_proj, o_proj; experts gate_up_proj (fused), down_proj (fused)",
    ]
    stop = (
        "LoRA adapts the experts of 0 of the 2 MoE layers (gate_up_proj (fused), down_proj (fused) left out), so the "
        "experts, most of the model, are not trained (--lora_target_experts names them; none leaves them out on "
        "purpose)"
    )
    with pytest.raises(UserError, match=re.escape(f"--lora_target_modules q_proj,v_proj: {stop}")):
        skipped.check(False, "q_proj,v_proj")
    assert skipped.check(False, "q_proj,v_proj", experts_off=True) == (
        "LoRA targets q_proj,v_proj leave out: attention (k_proj, o_proj); experts (gate_up_proj (fused), "
        "down_proj (fused))"
    )


def test_trainer_prints_the_table_and_stops_on_skipped_experts(tiny_model, qwen_style_tokenizer, tmp_path, package_log):
    make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, lora_target_modules="q_proj,v_proj")
    out = package_log.read()
    assert "LoRA coverage (adapted/linear modules per decoder layer):\nlayers   attention  mlp\n0-1      2/4" in out
    assert (
        "LoRA targets q_proj,v_proj leave out: attention (k_proj, o_proj); mlp (gate_proj, up_proj, down_proj)" in out
    )
    with pytest.raises(UserError, match="LoRA adapts the experts of 0 of the 2 MoE layers"):
        make_trainer(
            build_tiny_moe("qwen3_moe", qwen_style_tokenizer),
            qwen_style_tokenizer,
            tmp_path,
            lora_target_modules="q_proj",
        )
    moe = build_tiny_moe("qwen3_moe", qwen_style_tokenizer)
    make_trainer(moe, qwen_style_tokenizer, tmp_path, lora_target_modules="q_proj", lora_target_experts="none")
    assert "LoRA targets q_proj leave out: attention (k_proj, v_proj, o_proj); experts" in package_log.read()


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


VLM_TABLE = """\
LoRA coverage (adapted/linear modules per decoder layer of the language model):
layers   attention  mlp
0-1      4/4        3/3"""


def test_a_vision_language_model_shows_its_language_model_and_vision_parts_apart():
    """The tower's blocks are numbered layers too: they are kept out of the language model's rows."""
    from hf_lora_ds._testing.tiny_vlms import build_tiny_vlm
    from hf_lora_ds.config.vision import VisionTraining

    model, _ = build_tiny_vlm("qwen3_vl")
    frozen = coverage(model, target_modules="all-linear")
    assert frozen.table() == "\n".join(
        [
            VLM_TABLE,
            "vision tower (model.visual): frozen, no LoRA (0/8 linear modules)",
            "projector (model.visual.merger, model.visual.deepstack_merger_list): frozen, no LoRA (0/4 linear modules)",
        ]
    )
    assert frozen.check(False, "all-linear") is None
    model, _ = build_tiny_vlm("smolvlm")
    config = LoraConfig(r=2, target_modules="all-linear")
    trained = lora_coverage(wrap_with_lora(model, config, VisionTraining(tower="lora", projector="full")))
    assert trained.table().splitlines()[3:] == [
        "vision tower (model.vision_model): LoRA on 12/12 linear modules",
        "projector (model.connector): trained in full",
    ]


def test_the_audit_shows_a_vision_language_models_parts_from_its_config_alone():
    from hf_lora_ds._testing.tiny_vlms import build_tiny_vlm
    from hf_lora_ds.config.vision import VisionTraining
    from hf_lora_ds.model.lora_coverage import meta_coverage

    model, _ = build_tiny_vlm("gemma3")
    config = LoraConfig(r=2, target_modules="all-linear")
    shown = meta_coverage(model.config, config, vision=VisionTraining(projector="full")).table()
    assert shown.splitlines()[3:] == [
        "vision tower (model.vision_tower): frozen, no LoRA (0/12 linear modules)",
        "projector (model.multi_modal_projector): trained in full",
    ]

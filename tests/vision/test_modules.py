"""The vision side of a tiny model of every family: its parts found by identity, LoRA only in the language model by
default (however the targets are named), the tower and projector frozen or trained as asked, and a frozen tower run
without an autograd graph under gradient checkpointing while the language model's adapters get their gradient."""

from __future__ import annotations

import contextlib

import pytest
import torch
from peft import LoraConfig
from peft.tuners.tuners_utils import BaseTunerLayer

from hf_lora_ds._testing.tiny_vlms import VLM_FAMILIES, build_tiny_vlm, tiny_image
from hf_lora_ds.config.vision import FROZEN_VISION, VisionTraining
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.lora import wrap_with_lora
from hf_lora_ds.vision.modules import (
    LANGUAGE_MODEL,
    PROJECTOR,
    TOWER,
    full_training_modules,
    run_frozen_tower_without_graph,
    vision_parts,
)

# Families whose projector sits inside the tower (Qwen-VL's merger): the frozen tower must leave it its gradient.
PROJECTOR_IN_TOWER = ("qwen2_5_vl", "qwen3_vl")
# Families whose projector has linear layers LoRA can adapt (Gemma 3's is a bare weight matrix and a norm).
LORA_PROJECTOR = tuple(family for family in VLM_FAMILIES if family != "gemma3")


def wrapped(family: str, vision: VisionTraining = FROZEN_VISION, checkpointing: bool = False, **lora):
    """The family's tiny model wrapped as a run wraps it; with ``checkpointing``, prepared as Trainer prepares it for
    gradient checkpointing first (``enable_input_require_grads`` hooks every sub-model's input embeddings)."""
    model, processor = build_tiny_vlm(family)
    if family == "gemma3":  # Gemma 3 starts its projection at zero, which would keep every vision gradient zero
        torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.5)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    config = LoraConfig(r=4, target_modules=lora.pop("target_modules", "all-linear"), **lora)
    model = wrap_with_lora(model, config, vision)
    model.train()
    return model, processor


def image_batch(processor) -> dict[str, torch.Tensor]:
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "which colour?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "red"}]},
    ]
    text = processor.apply_chat_template(messages, tokenize=False)
    batch = dict(processor(text=[text], images=[tiny_image()], return_tensors="pt"))
    batch["labels"] = batch["input_ids"].clone()
    return batch


def adapters_by_part(model) -> dict[str | None, int]:
    parts = vision_parts(model)
    counts = {LANGUAGE_MODEL: 0, TOWER: 0, PROJECTOR: 0}
    for name, module in model.named_modules():
        if isinstance(module, BaseTunerLayer):
            counts[parts.part_of(name)] += 1
    return counts


def grads_by_part(model, kind: str) -> dict[str, list[float]]:
    """Per part, the gradient size of each trainable parameter whose name holds ``kind`` (0 where it got none)."""
    parts = vision_parts(model)
    sizes: dict[str, list[float]] = {LANGUAGE_MODEL: [], TOWER: [], PROJECTOR: []}
    for name, param in model.named_parameters():
        if param.requires_grad and kind in name:
            sizes[parts.part_of(name)].append(0.0 if param.grad is None else param.grad.abs().sum().item())
    return sizes


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_the_parts_are_the_models_own_decoder_image_encoder_and_the_modules_beside_them(family):
    model, _ = build_tiny_vlm(family)
    parts = vision_parts(model)
    assert model.get_submodule(parts.language_model) is model.get_decoder()
    assert model.get_submodule(parts.tower) is model.get_encoder(modality="image")
    assert parts.projectors and all(parts.part_of(name) == PROJECTOR for name in parts.projectors)
    assert parts.part_of("lm_head") is None


def test_qwen_vl_mergers_inside_the_tower_are_the_projector():
    """Qwen3-VL's deepstack mergers trained with the tower frozen in LLaMA-Factory (PR #9399)."""
    model, _ = build_tiny_vlm("qwen3_vl")
    parts = vision_parts(model)
    for name in ("model.visual.merger.linear_fc1", "model.visual.deepstack_merger_list.0.linear_fc1"):
        assert parts.part_of(name) == PROJECTOR
    assert parts.part_of("model.visual.blocks.0.attn.qkv") == TOWER


def test_a_text_model_has_no_vision_parts(tiny_model):
    assert vision_parts(tiny_model) is None
    assert full_training_modules(tiny_model, VisionTraining("full", "full")) == []


@pytest.mark.parametrize("family", VLM_FAMILIES)
@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_by_default_lora_lands_in_the_language_model_only_and_the_vision_side_is_frozen(family, targets):
    """PEFT's own matching puts ``all-linear`` adapters into the tower of every family, and ``q_proj,v_proj`` into
    the SigLIP and InternViT towers."""
    model, _ = wrapped(family, target_modules=targets)
    counts = adapters_by_part(model)
    assert counts[LANGUAGE_MODEL] > 0 and (counts[TOWER], counts[PROJECTOR]) == (0, 0)
    parts = vision_parts(model)
    trainable = {parts.part_of(name) for name, param in model.named_parameters() if param.requires_grad}
    assert trainable == {LANGUAGE_MODEL}


def test_a_name_of_the_frozen_tower_only_is_refused_naming_the_flag():
    with pytest.raises(UserError, match="qkv names layers of the vision tower only.*--train_vision_tower lora"):
        wrapped("qwen2_5_vl", target_modules=["q_proj", "qkv"])
    with pytest.raises(UserError, match="fc1 names layers of the vision tower only.*--train_vision_tower lora"):
        wrapped("smolvlm", target_modules=["q_proj", "fc1"])


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_lora_on_the_tower_adapts_it_and_its_adapters_get_gradients(family):
    model, processor = wrapped(family, VisionTraining(tower="lora"))
    counts = adapters_by_part(model)
    assert counts[TOWER] > 0 and counts[PROJECTOR] == 0
    model(**image_batch(processor)).loss.backward()
    assert sum(grads_by_part(model, "lora_B")[TOWER]) > 0


@pytest.mark.parametrize("family", LORA_PROJECTOR)
def test_lora_on_the_projector_adapts_it_only(family):
    model, processor = wrapped(family, VisionTraining(projector="lora"))
    counts = adapters_by_part(model)
    assert counts[PROJECTOR] > 0 and counts[TOWER] == 0
    model(**image_batch(processor)).loss.backward()
    assert sum(grads_by_part(model, "lora_B")[PROJECTOR]) > 0


def test_lora_on_a_projector_without_linear_layers_is_refused():
    with pytest.raises(UserError, match="^--train_projector lora: the projector of this model has no layer LoRA"):
        wrapped("gemma3", VisionTraining(projector="lora"))


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_a_fully_trained_projector_trains_every_weight_and_is_saved_with_the_adapter(family):
    model, processor = wrapped(family, VisionTraining(projector="full"), checkpointing=True)
    parts = vision_parts(model)
    saved = model.peft_config["default"].modules_to_save
    assert saved and all(parts.part_of(f"base_model.model.{name}") == PROJECTOR for name in saved)
    model(**image_batch(processor)).loss.backward()
    projector = grads_by_part(model, "modules_to_save")[PROJECTOR]
    assert projector and all(size > 0 for size in projector)
    assert not any(param.requires_grad for name, param in model.named_parameters() if parts.part_of(name) == TOWER)


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_a_fully_trained_tower_leaves_its_projector_alone(family):
    model, _ = wrapped(family, VisionTraining(tower="full"))
    parts = vision_parts(model)
    saved = model.peft_config["default"].modules_to_save
    assert saved and {parts.part_of(f"base_model.model.{name}") for name in saved} == {TOWER}
    trainable = {parts.part_of(name) for name, param in model.named_parameters() if param.requires_grad}
    assert trainable == {LANGUAGE_MODEL, TOWER}


@contextlib.contextmanager
def graph_in_tower(model, parts) -> list[int]:
    """Counts the tensors autograd saves for backward while a layer of the tower (not its projector) runs (its patch
    embedding and its blocks, which hold all its weights and all its work), and the layers' outputs that autograd
    made (a gradient-checkpointed block saves under its own hooks, seen only there)."""
    inside = [0]
    found = [0]

    def enter(*_):
        inside[0] += 1

    def leave(_module, _args, output):
        inside[0] -= 1
        outputs = output if isinstance(output, tuple) else (output,)
        found[0] += sum(torch.is_tensor(tensor) and tensor.grad_fn is not None for tensor in outputs)

    handles = []
    for name, module in model.named_modules():
        if parts.part_of(name) == TOWER and next(module.parameters(recurse=False), None) is not None:
            handles.append(module.register_forward_pre_hook(enter))
            handles.append(module.register_forward_hook(leave, always_call=True))

    def pack(tensor):
        found[0] += bool(inside[0])
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield found
    for handle in handles:
        handle.remove()


@pytest.mark.parametrize("family", VLM_FAMILIES)
@pytest.mark.parametrize("projector", ["off", "full"])
def test_a_frozen_tower_runs_without_a_graph_under_gradient_checkpointing_and_the_lm_still_learns(family, projector):
    model, processor = wrapped(family, VisionTraining(projector=projector), checkpointing=True)
    parts = vision_parts(model)
    with graph_in_tower(model, parts) as graph:
        loss = model(**image_batch(processor)).loss
    assert graph == [0]
    loss.backward()
    grads = grads_by_part(model, "lora_B")
    assert grads[LANGUAGE_MODEL] and all(size > 0 for size in grads[LANGUAGE_MODEL])
    if projector == "full":
        assert all(size > 0 for size in grads_by_part(model, "modules_to_save")[PROJECTOR])


def test_the_no_grad_hooks_go_in_once_and_restore_the_callers_mode():
    model, processor = wrapped("qwen2_5_vl")
    tower = model.get_submodule(vision_parts(model).tower)
    hooks = len(tower._forward_pre_hooks)
    run_frozen_tower_without_graph(model)  # a second wrap of the same model (a user-built PeftModel)
    assert len(tower._forward_pre_hooks) == hooks
    model(**image_batch(processor))
    assert torch.is_grad_enabled()


def test_no_targets_named_is_refused_in_one_line():
    """PEFT has no default LoRA targets for any of these families."""
    with pytest.raises(UserError, match="^--lora_target_modules: none named"):
        wrapped("internvl", target_modules=None)

"""On a GPU: the planner's per-device figure, less the CUDA context and the allocator's reserve (which
``max_memory_allocated`` does not see), against the peak ``torch.cuda.max_memory_allocated`` that
MemoryTraceCallback measures while training, within ±30%.
Skipped where no CUDA device is present (tests/conftest.py)."""

from __future__ import annotations

import pytest

from bench.memory_plan import SHAPES, build_model_dir, measure, predict, write_records
from hf_lora_ds.plan.estimate import ALLOCATOR_RESERVE_ITEM, CUDA_CONTEXT_ITEM

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.parametrize("shape, checkpointing", [("states", False), ("activations", False), ("activations", True)])
def test_prediction_within_30_percent_of_max_memory_allocated(shape, checkpointing, tmp_path):
    spec = SHAPES[shape]
    model_dir = build_model_dir(spec, tmp_path / "model")
    train_file = write_records(spec, tmp_path / "train.jsonl")
    row = predict(spec, model_dir, train_file, "none", checkpointing, on_gpu=True)
    outside = row["device_items"][CUDA_CONTEXT_ITEM] + row["device_items"][ALLOCATOR_RESERVE_ITEM]
    predicted = (row["device_bytes"] - outside) / 2**20
    measured = measure(spec, model_dir, train_file, "none", checkpointing, tmp_path, on_gpu=True)
    assert 0.7 <= predicted / measured <= 1.3, f"predicted {predicted:.0f} MiB, measured {measured:.0f} MiB: {row}"


def test_saved_activations_equal_a_cuda_autocast_forward(qwen_style_tokenizer):
    """The planner's meta count for a GPU run (autocast, CUDA's fused dropout) against what autograd keeps in a
    real bf16 forward on CUDA under autocast, LoRA's adapters in fp32."""
    import torch
    from peft import get_peft_model

    from hf_lora_ds._testing.tiny_models import build_tiny_qwen2
    from hf_lora_ds.plan.model_shape import measure_model_shape
    from tests.plan.test_model_shape import lora, real_saved_bytes

    base = build_tiny_qwen2(qwen_style_tokenizer, hidden_size=64, num_hidden_layers=3).to("cuda", torch.bfloat16)
    base.set_attn_implementation("eager")
    real = get_peft_model(base, lora())
    shape = measure_model_shape(
        base.config, lora(), torch.bfloat16, 32, attn_implementation="eager", on_accelerator=True
    )
    with torch.autocast("cuda", dtype=torch.bfloat16):
        expected = real_saved_bytes(real, 32, device="cuda")
    assert shape.activation_bytes(1, gradient_checkpointing=False) == expected + shape.backward_working_bytes

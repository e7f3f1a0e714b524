"""Each term of the estimate moves the way its configuration says, on a fixed shape (no model built)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hf_lora_ds.plan.estimate import (
    ALLOCATOR_RESERVE_FRACTION,
    ALLOCATOR_RESERVE_ITEM,
    CUDA_CONTEXT_ITEM,
    BatchShape,
    DeepSpeedLayout,
    estimate_memory,
)
from hf_lora_ds.plan.model_shape import ModelShape
from hf_lora_ds.training.fused_head_loss import CHUNK_BYTES, chunk_rows

SHAPE = ModelShape(
    frozen_params=1_000_000_000,
    trainable_params=10_000_000,
    frozen_weight_bytes=2_000_000_000,
    largest_module_bytes=300_000_000,
    hidden_size=2048,
    vocab_size=150_000,
    num_layers=24,
    seq_len=1024,
    first_layer_activation_bytes=40_000_000,
    layer_activation_bytes=50_000_000,
    layer_input_bytes=4_000_000,
    backward_working_bytes=30_000_000,
)
BATCH = BatchShape(rows=2, row_tokens=1024, supervised_tokens=600)
STAGE = {stage: DeepSpeedLayout(stage=stage) for stage in (0, 1, 2, 3)}
NO_DEEPSPEED = DeepSpeedLayout()


def estimate(
    layout=NO_DEEPSPEED,
    batch=BATCH,
    world_size=4,
    gc=False,
    supervised_only=True,
    accelerator=True,
    sequence_parallel=1,
    shape=SHAPE,
):
    return estimate_memory(
        shape,
        batch,
        layout,
        world_size=world_size,
        ranks_per_node=world_size,
        weight_bytes=2,
        gradient_checkpointing=gc,
        supervised_logits_only=supervised_only,
        on_accelerator=accelerator,
        runtime_bytes=500_000_000,
        sequence_parallel=sequence_parallel,
    )


def test_only_zero3_partitions_the_frozen_weights():
    assert estimate().device_items["frozen weights"] == 2_000_000_000
    for stage in (0, 1, 2):
        assert estimate(STAGE[stage]).device_items["frozen weights"] == 2_000_000_000
    assert estimate(STAGE[3]).device_items["frozen weights"] == 500_000_000


def test_zero3_keeps_gathered_weights_up_to_the_reuse_distance():
    buffers = estimate(STAGE[3]).device_items["ZeRO-3 gathered weights"]
    # 1.01e9 elements, which a reuse distance of 1e9 would keep: stage3_max_live_parameters (1e9) caps them
    assert buffers == 2 * 10**9
    short = estimate(DeepSpeedLayout(stage=3, reuse_distance=0)).device_items["ZeRO-3 gathered weights"]
    assert short == SHAPE.largest_module_bytes  # the module that runs is gathered whole


def test_zero3_gather_buffers_follow_the_deepspeed_config():
    config = {
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 5e6,
            "stage3_prefetch_bucket_size": 3e6,
            "stage3_max_live_parameters": 4e8,
        }
    }
    items = estimate(DeepSpeedLayout.from_config(config)).device_items
    assert items["ZeRO reduce bucket"] == 5_000_000 * 2  # allocated whole, in the gradients' bf16
    assert items["ZeRO-3 gathered weights"] == 400_000_000 * 2  # the reuse distance would keep all 1.01e9
    assert items["ZeRO-3 prefetch bucket"] == 0  # the live limit is reached by the kept weights
    roomy = estimate(DeepSpeedLayout(stage=3, reuse_distance=0, prefetch_bucket_size=3_000_000)).device_items
    assert roomy["ZeRO-3 prefetch bucket"] == 3_000_000 * 2
    auto = estimate(DeepSpeedLayout(stage=3, reuse_distance=0)).device_items  # "auto": hidden_size², 0.9 of it
    assert auto["ZeRO reduce bucket"] == 2048**2 * 2
    assert auto["ZeRO-3 prefetch bucket"] == int(0.9 * 2048**2) * 2


def test_cuda_counts_the_allocator_reserve_and_the_context_and_a_cpu_neither():
    items = estimate().device_items
    step_shaped = items["activations"] + items["logits and loss"]
    assert items[ALLOCATOR_RESERVE_ITEM] == int(ALLOCATOR_RESERVE_FRACTION * step_shaped)
    assert items[CUDA_CONTEXT_ITEM] == 500_000_000  # the runtime the planner passes: CUDA_CONTEXT_BYTES on a GPU
    longer = estimate(batch=replace(BATCH, row_tokens=2048)).device_items
    assert longer[ALLOCATOR_RESERVE_ITEM] > items[ALLOCATOR_RESERVE_ITEM]  # grows with the batch, not the weights
    on_cpu = estimate(accelerator=False).device_items
    assert ALLOCATOR_RESERVE_ITEM not in on_cpu and CUDA_CONTEXT_ITEM not in on_cpu
    assert on_cpu["runtime"] == 500_000_000


def test_optimizer_state_is_partitioned_from_stage_1_and_gradients_from_stage_2():
    optimizer = {stage: estimate(STAGE[stage]).device_items["optimizer states"] for stage in (0, 1, 2, 3)}
    gradients = {stage: estimate(STAGE[stage]).device_items["gradients"] for stage in (0, 1, 2, 3)}
    assert optimizer[0] == 12 * SHAPE.trainable_params  # two fp32 moments and an fp32 master copy
    assert optimizer[1] == optimizer[2] == optimizer[3] == optimizer[0] // 4
    assert gradients[2] == gradients[3] == 4 * SHAPE.trainable_params // 4 < gradients[1] < gradients[0]


def test_offload_moves_states_to_the_host_on_an_accelerator_only():
    on_gpu = estimate(DeepSpeedLayout(stage=3, offload_optimizer=True, offload_param=True))
    assert on_gpu.device_items["optimizer states"] == on_gpu.device_items["frozen weights"] == 0
    assert on_gpu.host_items["frozen weights (offloaded)"] >= 4 * 500_000_000
    on_cpu = estimate(DeepSpeedLayout(stage=3, offload_optimizer=True, offload_param=True), accelerator=False)
    assert on_cpu.device_items["frozen weights (offloaded)"] == on_gpu.host_items["frozen weights (offloaded)"] // 4
    assert on_cpu.host_bytes == 4 * on_cpu.device_bytes  # one memory, shared by the node's ranks


def test_gradient_checkpointing_trades_activations():
    without, with_gc = estimate(gc=False), estimate(gc=True)
    backward = 30_000_000  # a layer's backward working memory
    assert without.device_items["activations"] == 2 * (40_000_000 + 23 * 50_000_000 + backward)
    assert with_gc.device_items["activations"] == 2 * (24 * 4_000_000 + 50_000_000 + backward)


def test_logits_follow_the_supervised_positions_and_the_chunking():
    """Fused head-and-loss: the hidden rows and their gradient, and one chunk of logits (bf16 output, fp32 upcast,
    fp32 log-probabilities) at the end of forward; a chunk is capped by the budget, not by the batch. With enough
    rows, backward's fp32 copy of their gradient outweighs the chunk."""
    hidden_rows = 2 * SHAPE.hidden_size * 2
    small = BatchShape(rows=2, row_tokens=64, supervised_tokens=50)  # fewer rows than a chunk
    assert estimate(batch=small).device_items["logits and loss"] == 50 * hidden_rows + 50 * 150_000 * (2 + 4 + 4)
    full = estimate(batch=small, supervised_only=False).device_items["logits and loss"]
    assert full == 128 * 150_000 * 20
    rows = chunk_rows(150_000, 2)
    assert rows < 600 and rows * 150_000 * (2 * 2 + 8) <= CHUNK_BYTES
    chunked = estimate().device_items["logits and loss"]  # 600 rows: one chunk of them at a time
    assert chunked == 600 * hidden_rows + rows * 150_000 * (2 + 4 + 4)
    eightfold = estimate(batch=BatchShape(rows=16, row_tokens=1024, supervised_tokens=4800))
    assert eightfold.device_items["logits and loss"] - chunked == 4200 * hidden_rows
    many = estimate(batch=BatchShape(rows=64, row_tokens=1024, supervised_tokens=40_000))
    assert many.device_items["logits and loss"] == 40_000 * (hidden_rows + 4 * SHAPE.hidden_size)


@pytest.mark.parametrize("config", [{"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}}, None])
def test_layout_from_config(config):
    layout = DeepSpeedLayout.from_config(config)
    assert (layout.stage, layout.reduce_bucket_size) == ((2, 500_000_000) if config else (None, None))


def test_fsdp2_shards_every_state_and_gathers_a_unit_at_a_time():
    items = estimate(DeepSpeedLayout(fsdp=True)).device_items
    assert items["frozen weights"] == 2_000_000_000 // 4
    assert items["LoRA weights"] == items["gradients"] == 4 * SHAPE.trainable_params // 4  # fp32 adapters
    assert items["optimizer states"] == 8 * SHAPE.trainable_params // 4
    assert items["FSDP gathered units"] == 2 * SHAPE.largest_module_bytes
    assert items["activations"] == estimate().device_items["activations"]  # nothing shards the batch
    offloaded = estimate(DeepSpeedLayout(fsdp=True, offload_param=True))
    assert offloaded.device_items["frozen weights"] == offloaded.device_items["optimizer states"] == 0
    assert offloaded.host_items["sharded states (offloaded)"] == 4 * (
        items["frozen weights"] + 16 * SHAPE.trainable_params // 4
    )


def test_a_lora_init_pass_counts_where_it_exceeds_what_training_adds():
    """CorDA's covariances live before step 1, when gradients, optimizer states, activations and logits do not."""
    from dataclasses import replace

    items = estimate().device_items
    training_only = sum(items[name] for name in ("gradients", "optimizer states", "activations", "logits and loss"))
    small = estimate_memory(
        replace(SHAPE, init_pass_bytes=training_only // 2),
        BATCH,
        NO_DEEPSPEED,
        world_size=4,
        ranks_per_node=4,
        weight_bytes=2,
        gradient_checkpointing=False,
        supervised_logits_only=True,
        on_accelerator=True,
        runtime_bytes=500_000_000,
    )
    assert small.device_bytes == estimate().device_bytes
    big = estimate_memory(
        replace(SHAPE, init_pass_bytes=training_only + 10**9),
        BATCH,
        NO_DEEPSPEED,
        world_size=4,
        ranks_per_node=4,
        weight_bytes=2,
        gradient_checkpointing=False,
        supervised_logits_only=True,
        on_accelerator=True,
        runtime_bytes=500_000_000,
    )
    assert big.device_items["LoRA init pass (beyond training's peak)"] == 10**9


def test_sequence_parallelism_splits_activations_and_logits_and_adds_its_exchange():
    shape = replace(SHAPE, attention_heads=16, kv_heads=2, head_dim=128)
    whole, split = estimate(STAGE[2], shape=shape), estimate(STAGE[2], shape=shape, sequence_parallel=4)
    assert split.device_items["activations"] == whole.device_items["activations"] // 4
    assert split.device_items["logits and loss"] < whole.device_items["logits and loss"]
    assert "sequence-parallel exchange" not in whole.device_items
    # q (16 heads) and the output out and back, k and v with their 2 heads replicated to 4, sent and received, for
    # the shard's 2 x 256 tokens; plus the group's 4 batches of ids, labels and positions gathered on every rank.
    exchange = 2 * 2 * 256 * (2 * 16 + 2 * 4) * 128 * 2 + 4 * 2 * 1024 * 3 * 8
    assert split.device_items["sequence-parallel exchange"] == exchange
    for state in ("frozen weights", "optimizer states", "gradients"):  # still partitioned over every rank
        assert split.device_items[state] == whole.device_items[state]

"""Peak memory per device and per node for one configuration, itemised: the model states ZeRO partitions, the
activations and logits it does not, and the buffers DeepSpeed adds.

DeepSpeed's own estimators assume every parameter trains; with LoRA the frozen base has no gradient and no optimizer
state, so only ZeRO-3 and parameter offload shrink it, while the LoRA weights carry the usual fp32 Adam states.
Sequence parallelism splits activations and logits over its group; logits follow what ``LoraSFTTrainer`` computes
(the fused head-and-loss: one chunk alive at a time). On a CPU-only machine the "device" is the process's host
memory, with a measured baseline for the imported training stack; on CUDA the estimate adds what the caching
allocator reserves beyond its allocated peak and the CUDA context, so that the figure is what the device must hold
(``ITEM_NOTES`` says what each such term is; the plan's table prints it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_lora_ds.config.zero_settings import ZeroSettings
from hf_lora_ds.plan.model_shape import ModelShape
from hf_lora_ds.training.fused_head_loss import chunk_rows

__all__ = [
    "BatchShape",
    "DeepSpeedLayout",
    "Estimate",
    "estimate_memory",
    "ALLOCATOR_RESERVE_FRACTION",
    "ALLOCATOR_RESERVE_ITEM",
    "CUDA_CONTEXT_BYTES",
    "CUDA_CONTEXT_ITEM",
    "ITEM_NOTES",
]

# What a CUDA context and cuBLAS/cuDNN workspaces take on the device before the first tensor: not counted by
# torch.cuda.max_memory_allocated, seen by nvidia-smi; 0.5-1 GiB on recent GPUs and drivers.
CUDA_CONTEXT_BYTES = 768 * 2**20
CUDA_CONTEXT_ITEM = "CUDA context"
# torch's caching allocator keeps freed blocks for reuse and rounds requests up (to 512 B, large ones to 2 MiB, 1-10
# MiB requests carved from 20 MiB segments), so max_memory_reserved exceeds max_memory_allocated. The tensors that
# change shape from step to step (a padded batch's activations and logits) fragment the cache; the weights and the
# optimizer's states, allocated once, round by a negligible amount. An assumed fraction of the former, to be checked
# against the reserved peaks bench/gpu/run_acceptance.py now records.
ALLOCATOR_RESERVE_FRACTION = 0.2
ALLOCATOR_RESERVE_ITEM = "allocator reserve"
_STEP_SHAPED_ITEMS = ("activations", "logits and loss", "sequence-parallel exchange")
ITEM_NOTES = {
    CUDA_CONTEXT_ITEM: "the driver's context and cuBLAS workspaces, outside torch's allocator",
    ALLOCATOR_RESERVE_ITEM: (
        f"cached and rounded blocks beyond max_memory_allocated: {ALLOCATOR_RESERVE_FRACTION:.0%} of the "
        "activations and logits, whose shapes change from step to step"
    ),
    "ZeRO reduce bucket": "gradients gathered for reduction: reduce_bucket_size elements (auto: hidden_size²)",
    "ZeRO-3 gathered weights": (
        "weights gathered whole: those used again within stage3_max_reuse_distance elements, at least the largest "
        "module, at most stage3_max_live_parameters"
    ),
    "ZeRO-3 prefetch bucket": (
        "weights gathered ahead of use: stage3_prefetch_bucket_size elements (auto: 0.9 · hidden_size²), within "
        "stage3_max_live_parameters"
    ),
}


@dataclass(frozen=True)
class DeepSpeedLayout:
    """The parts of a resolved DeepSpeed config that move memory. ``stage`` None: no DeepSpeed (plain or DDP)."""

    stage: int | None = None
    offload_optimizer: bool = False
    offload_param: bool = False
    reduce_bucket_size: int | None = None  # elements; None: "auto" (hidden_size², as transformers fills it in)
    prefetch_bucket_size: int | None = None  # ZeRO-3 only; None: "auto" (0.9 · hidden_size²)
    reuse_distance: int = 10**9  # ZeRO-3: a gathered weight used again within this many elements stays gathered
    max_live_parameters: int = 10**9  # ZeRO-3: at most this many elements gathered at once, prefetch included
    fsdp: bool = False  # FSDP2 instead of DeepSpeed: everything sharded, one wrapped unit gathered at a time

    @classmethod
    def from_config(cls, config: dict | None) -> DeepSpeedLayout:
        if config is None:
            return cls()
        if "fsdp" in config:  # the planner's FSDP2 rows: {"fsdp": transformers' fsdp_config}
            return cls(fsdp=True, offload_param=bool(config["fsdp"].get("cpu_offload", False)))
        zero_settings = ZeroSettings.of(config)
        zero = config.get("zero_optimization", {})  # the planner's bucket sizes, read here only

        def elements(key: str) -> int | None:
            value = zero.get(key, "auto")
            return None if value == "auto" else int(float(value))

        return cls(
            stage=zero_settings.stage,
            offload_optimizer=zero_settings.offloads_optimizer,
            offload_param=zero_settings.offloads_params,
            reduce_bucket_size=elements("reduce_bucket_size"),
            prefetch_bucket_size=elements("stage3_prefetch_bucket_size"),
            reuse_distance=int(float(zero.get("stage3_max_reuse_distance", 10**9))),
            max_live_parameters=int(float(zero.get("stage3_max_live_parameters", 10**9))),
        )


@dataclass(frozen=True)
class BatchShape:
    """The largest micro-batch a device sees: ``rows`` sequences of ``row_tokens`` (padded; one row of all tokens
    when padding-free) with ``supervised_tokens`` trained labels among them."""

    rows: int
    row_tokens: int
    supervised_tokens: int


@dataclass
class Estimate:
    """Bytes per device (itemised) and per node. ``host_items`` is what lives in host RAM on each node."""

    device_items: dict[str, int] = field(default_factory=dict)
    host_items: dict[str, int] = field(default_factory=dict)

    @property
    def device_bytes(self) -> int:
        return sum(self.device_items.values())

    @property
    def host_bytes(self) -> int:
        return sum(self.host_items.values())


def estimate_memory(
    shape: ModelShape,
    batch: BatchShape,
    layout: DeepSpeedLayout,
    *,
    world_size: int,
    ranks_per_node: int,
    weight_bytes: int,
    gradient_checkpointing: bool,
    supervised_logits_only: bool,
    on_accelerator: bool,
    runtime_bytes: int,
    sequence_parallel: int = 1,
) -> Estimate:
    """The peak for one configuration. ``weight_bytes`` is the size of one element of the compute dtype;
    ``runtime_bytes`` the fixed per-process cost (a CUDA context, or the measured CPU baseline);
    ``sequence_parallel`` the ranks each sequence is split over (DeepSpeed configurations only)."""
    if layout.fsdp:
        return _fsdp_estimate(
            shape,
            batch,
            layout,
            world_size,
            ranks_per_node,
            weight_bytes,
            gradient_checkpointing,
            supervised_logits_only,
            on_accelerator,
            runtime_bytes,
        )
    stage = layout.stage
    frozen = shape.frozen_weight_bytes // (world_size if stage == 3 else 1)
    states = _lora_states(shape.trainable_params, layout, world_size, weight_bytes)
    moved_params = layout.offload_param and stage == 3
    moved_optimizer = layout.offload_optimizer and stage is not None

    device: dict[str, int] = {"frozen weights": 0 if moved_params else frozen}
    host: dict[str, int] = {}
    device["LoRA weights"] = 0 if moved_params else states["weights"]
    device["gradients"] = states["gradients"]
    device["optimizer states"] = 0 if moved_optimizer else states["optimizer"]
    if moved_params:
        host["frozen weights (offloaded)"] = (frozen + states["weights"]) * ranks_per_node
    if moved_optimizer:
        host["optimizer states (offloaded)"] = (states["optimizer"] + states["gradients"]) * ranks_per_node
    _add_batch_terms(
        device, shape, batch, weight_bytes, gradient_checkpointing, supervised_logits_only, sequence_parallel
    )
    _add_init_pass(device, shape)
    device.update(_deepspeed_buffers(shape, layout, weight_bytes))
    _add_runtime(device, runtime_bytes, on_accelerator)
    host["model loading"] = _loading_bytes(shape, stage, world_size) * ranks_per_node
    return _one_memory_on_cpu(device, host, ranks_per_node, on_accelerator)


def _add_batch_terms(
    device: dict[str, int],
    shape: ModelShape,
    batch: BatchShape,
    weight_bytes: int,
    gradient_checkpointing: bool,
    supervised_logits_only: bool,
    sequence_parallel: int = 1,
) -> None:
    """What no engine partitions: the batch's activations and its logits, 1/N of them per rank under sequence
    parallelism, which adds its exchange buffers."""
    shard = BatchShape(
        rows=batch.rows,
        row_tokens=-(-batch.row_tokens // sequence_parallel),
        supervised_tokens=-(-batch.supervised_tokens // sequence_parallel),
    )
    device["activations"] = (
        shape.activation_bytes(shard.rows, gradient_checkpointing) * shard.row_tokens // shape.seq_len
    )
    device["logits and loss"] = _logits_bytes(shape, shard, weight_bytes, supervised_logits_only)
    if sequence_parallel > 1:
        device["sequence-parallel exchange"] = _ulysses_bytes(shape, batch, shard, weight_bytes, sequence_parallel)


def _ulysses_bytes(shape: ModelShape, batch: BatchShape, shard: BatchShape, weight_bytes: int, size: int) -> int:
    """One attention layer's all-to-all at a time (forward, and again in backward): query, key and value (key/value
    heads replicated up to N when there are fewer) each copied contiguous to send and received, then the attention
    output the same way back; plus the group's N batches (ids, labels, positions: int64) the dataloader adapter
    gathers on every rank."""
    kv_heads = max(shape.kv_heads, size)
    per_token = (2 * shape.attention_heads + 2 * kv_heads) * shape.head_dim * weight_bytes
    exchange = 2 * shard.rows * shard.row_tokens * per_token
    gathered = size * batch.rows * batch.row_tokens * 3 * 8
    return exchange + gathered


def _add_init_pass(device: dict[str, int], shape: ModelShape) -> None:
    """The LoRA init's data pass (CorDA) holds its covariances before step 1, beside the weights but without the
    training's gradients, optimizer states, activations and logits: the peak is the larger of the two phases."""
    training_only = sum(
        device.get(item, 0) for item in ("gradients", "optimizer states", "activations", "logits and loss")
    )
    if shape.init_pass_bytes > training_only:
        device["LoRA init pass (beyond training's peak)"] = shape.init_pass_bytes - training_only


def _add_runtime(device: dict[str, int], runtime_bytes: int, on_accelerator: bool) -> None:
    """The fixed per-process cost; on CUDA the allocator's reserve as well (``ITEM_NOTES``). On a CPU the measured
    baseline RSS already holds what the allocator keeps."""
    if not on_accelerator:
        device["runtime"] = runtime_bytes
        return
    step_shaped = sum(device.get(item, 0) for item in _STEP_SHAPED_ITEMS)
    device[ALLOCATOR_RESERVE_ITEM] = int(ALLOCATOR_RESERVE_FRACTION * step_shaped)
    device[CUDA_CONTEXT_ITEM] = runtime_bytes


def _one_memory_on_cpu(device: dict[str, int], host: dict[str, int], ranks_per_node: int, on_accelerator: bool):
    if not on_accelerator:  # one memory: what the estimate calls "device" and "host" live in the same RSS
        device.update({name: value // ranks_per_node for name, value in host.items() if name != "model loading"})
        host = {"all ranks": sum(device.values()) * ranks_per_node}
    return Estimate(device_items=device, host_items=host)


def _fsdp_estimate(
    shape: ModelShape,
    batch: BatchShape,
    layout: DeepSpeedLayout,
    world_size: int,
    ranks_per_node: int,
    weight_bytes: int,
    gradient_checkpointing: bool,
    supervised_logits_only: bool,
    on_accelerator: bool,
    runtime_bytes: int,
) -> Estimate:
    """FSDP2 (``fully_shard`` per decoder layer and the root): frozen and LoRA weights, gradients and Adam states
    all sharded over the ranks (PEFT keeps the adapters in fp32); during forward and backward one unit is gathered
    whole and the next one prefetched; parameter offload keeps the shards, their gradients and the optimizer on
    the host. Every rank reads the whole model at load, before it is sharded."""
    trainable = shape.trainable_params
    sharded = {
        "frozen weights": shape.frozen_weight_bytes // world_size,
        "LoRA weights": 4 * trainable // world_size,
        "gradients": 4 * trainable // world_size,
        "optimizer states": 8 * trainable // world_size,
    }
    device: dict[str, int] = {name: 0 if layout.offload_param else value for name, value in sharded.items()}
    host: dict[str, int] = {}
    if layout.offload_param:
        host["sharded states (offloaded)"] = sum(sharded.values()) * ranks_per_node
    _add_batch_terms(device, shape, batch, weight_bytes, gradient_checkpointing, supervised_logits_only)
    device["FSDP gathered units"] = 2 * shape.largest_module_bytes  # the unit in use and the one prefetched
    _add_runtime(device, runtime_bytes, on_accelerator)
    host["model loading"] = shape.frozen_weight_bytes * ranks_per_node
    return _one_memory_on_cpu(device, host, ranks_per_node, on_accelerator)


def _lora_states(trainable: int, layout: DeepSpeedLayout, world_size: int, weight_bytes: int) -> dict[str, int]:
    """Bytes of the adapter's weights, gradients and Adam states on one device."""
    stage = layout.stage
    if stage is None:  # plain Trainer: PEFT keeps adapters in fp32, torch's AdamW two fp32 moments
        buckets = 4 * trainable if world_size > 1 else 0  # DDP reduces gradients through flat buckets: a copy
        return {"weights": 4 * trainable, "gradients": 4 * trainable + buckets, "optimizer": 8 * trainable}
    # DeepSpeed trains the adapters in the compute dtype; its optimizer keeps an fp32 master copy (a clone even in
    # fp32 from stage 1 on) and the moments, partitioned from stage 1 on.
    shards = world_size if stage >= 1 else 1
    master = 4 * trainable if (weight_bytes < 4 or stage >= 1) else 0
    optimizer = (8 * trainable + master) // shards
    weights = weight_bytes * trainable // (world_size if stage == 3 else 1)
    if stage >= 2:
        gradients = 4 * trainable // world_size
    elif stage == 1:
        gradients = weight_bytes * trainable + 4 * trainable // world_size
    else:
        gradients = weight_bytes * trainable + (4 * trainable if weight_bytes < 4 else 0)
    return {"weights": weights, "gradients": gradients, "optimizer": optimizer}


def _logits_bytes(shape: ModelShape, batch: BatchShape, weight_bytes: int, supervised_only: bool) -> int:
    """Full logits: the head output (compute dtype), the fp32 upcast (when the head is not fp32) and the
    log-softmax the loss keeps, then in backward the gradients of the fp32 part and of the head output.

    Supervised positions only (the fused head-and-loss), the larger of two moments: at the end of its forward the
    hidden rows and their gradient (compute dtype) with one chunk's logits at a time (the head output, its fp32
    upcast and the fp32 log-probabilities); at the start of backward that gradient, its fp32 copy and the scaled
    result."""
    if not supervised_only:
        elements = batch.rows * batch.row_tokens * shape.vocab_size
        upcast = 4 if weight_bytes < 4 else 0
        return elements * (2 * weight_bytes + upcast + 4 + 4 + upcast)
    row_elements = batch.supervised_tokens * shape.hidden_size
    upcast = 4 if weight_bytes < 4 else 0
    rows = min(batch.supervised_tokens, chunk_rows(shape.vocab_size, weight_bytes))
    chunk = rows * shape.vocab_size * (weight_bytes + upcast + 4)
    return 2 * weight_bytes * row_elements + max(chunk, 4 * row_elements)


def _deepspeed_buffers(shape: ModelShape, layout: DeepSpeedLayout, weight_bytes: int) -> dict[str, int]:
    """DeepSpeed's buffers, from its config (``auto`` sizes are transformers' fill-ins: hidden_size² and
    0.9 · hidden_size²). Stages 1-2: the gradient reduce bucket. ZeRO-3 (DeepSpeed 0.19's stage3.py and
    partitioned_param_coordinator.py): a contiguous-gradient bucket of reduce_bucket_size elements in the gradients'
    dtype, allocated whole; the gathered weights, of which at most stage3_max_live_parameters elements are alive at
    once, prefetch included.

    ZeRO-3 does not release a gathered weight that is used again within ``stage3_max_reuse_distance`` elements,
    and every weight the forward gathers is used again in backward: around the turn from forward to backward up to
    that many elements (1e9 in the shipped configs: all of a model below 1B parameters) are gathered at once."""
    if layout.stage is None or layout.stage == 0:
        return {}
    square = shape.hidden_size**2
    if layout.stage < 3:
        return {"ZeRO reduce bucket": min(layout.reduce_bucket_size or square, shape.trainable_params) * 4}
    live = layout.max_live_parameters
    kept = min(layout.reuse_distance, shape.frozen_params + shape.trainable_params)
    gathered = max(shape.largest_module_bytes // weight_bytes, min(kept, live))  # a module runs gathered whole
    prefetch = min(layout.prefetch_bucket_size or int(0.9 * square), max(0, live - gathered))
    return {
        "ZeRO reduce bucket": (layout.reduce_bucket_size or square) * weight_bytes,
        "ZeRO-3 gathered weights": gathered * weight_bytes,
        "ZeRO-3 prefetch bucket": prefetch * weight_bytes,
    }


def _loading_bytes(shape: ModelShape, stage: int | None, world_size: int) -> int:
    """Host memory one rank holds while ``from_pretrained`` reads the weights: the whole model, except under ZeRO-3,
    which partitions each layer as it is read (its share plus the layer being read)."""
    if stage == 3:
        return shape.frozen_weight_bytes // world_size + shape.largest_module_bytes
    return shape.frozen_weight_bytes

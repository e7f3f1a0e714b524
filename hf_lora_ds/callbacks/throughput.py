"""Tokens per second (all and supervised), padding efficiency and MFU, per logging window and for the whole run.

A ``TrainerCallback`` never sees the batches, so a forward pre-hook on the model counts them: it sees every training
forward's keyword arguments under DDP and DeepSpeed alike, whatever ``compute_loss`` or the collator do, and skips
evaluation forwards. MFU (PaLM, appendix B) is achieved model FLOP/s over the device's peak (``peak_flops_per_device``);
evaluation and checkpointing inside a window are left out of its clock.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers import TrainerControl, TrainerState, TrainingArguments
from transformers.utils import logging

from hf_lora_ds.callbacks.base import LoggingCallback
from hf_lora_ds.callbacks.vision_flops import VisionFlops
from hf_lora_ds.data.batches.packing import padding_segments
from hf_lora_ds.data.masking import IGNORE_INDEX
from hf_lora_ds.distributed import rank_and_world
from hf_lora_ds.model.experts import experts_per_token, moe_blocks, unwrapped_name
from hf_lora_ds.model.layer_kinds import sequence_mixers
from hf_lora_ds.vision.modules import PROJECTOR, TOWER, vision_parts

__all__ = [
    "ThroughputCallback",
    "flops_per_token",
    "flops_shape",
    "matmul_parameters",
    "measure_matmul_flops",
    "peak_flops_per_device",
]

logger = logging.get_logger(__name__)

_COUNTS = ("supervised", "real", "padded", "sequences", "vision_flops")

# Dense (no sparsity) bf16/fp16 tensor-core peaks from NVIDIA datasheets, TFLOP/s. First substring match wins.
_NVIDIA_DENSE_TFLOPS = (
    ("B200", 2250.0),
    ("H200", 989.4),
    ("H100 PCIe", 756.0),
    ("H100", 989.4),
    ("H800", 989.4),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.1),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10", 125.0),
    ("RTX 4090", 165.2),
    ("RTX 3090", 71.0),
)


def matmul_parameters(model: nn.Module, active: bool = True) -> tuple[int, int]:
    """(frozen, trainable) parameter counts of the weights a token is multiplied by; embedding lookups excluded. A
    routed expert's weights, and their LoRA factors, count for the share of tokens routed to it (top-k of the
    experts): the active parameters N_active of a Mixture-of-Experts model (all of them with ``active`` False). A
    vision-language model's tower and projector are left out: they run per image, not per token (``VisionFlops``)."""
    frozen = trainable = 0.0
    seen: set[int] = set()
    shares = _routed_shares(model) if active else {}
    parts = vision_parts(model)
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) or (parts is not None and parts.part_of(name) in (TOWER, PROJECTOR)):
            continue
        share = shares.get(unwrapped_name(name), 1.0)
        for param in module.parameters(recurse=False):
            if id(param) in seen or len(getattr(param, "ds_shape", param.shape)) < 2:  # ZeRO-3: an empty local shard
                continue
            seen.add(id(param))
            numel = int(getattr(param, "ds_numel", param.numel())) * share
            if param.requires_grad:
                trainable += numel
            else:
                frozen += numel
    return round(frozen), round(trainable)


def _routed_shares(model: nn.Module) -> dict[str, float]:
    """Module name (unwrapped) -> the share of tokens it sees, for the modules of routed experts (their LoRA layers
    included); top-k / experts, from the config."""
    blocks = moe_blocks(model)
    top_k = experts_per_token(getattr(model, "config", None)) if blocks else None
    if top_k is None:
        return {}
    shares = {}
    for name, _ in model.named_modules():
        path = unwrapped_name(name)
        block = next((b for b in blocks if path == b.experts or path.startswith(b.experts + ".")), None)
        if block is not None:
            shares[path] = min(1.0, top_k / block.num_experts)
    return shares


# Training FLOPs per element of a layer's recurrent state, per token (forward, then backward twice that): the delta
# rule reads the state, writes it and reads it out (3 matrix-vector products, 6 forward); a Mamba scan, and plain
# linear attention (MiniMax's lightning attention), update it and read it out (4 forward). A depthwise convolution's
# weight is counted with the matmul parameters.
_DELTA_RULE_FLOPS, _SCAN_FLOPS = 18, 12


def _attention_shape(model: nn.Module) -> tuple[int, int]:
    """(attention layers, heads·head_dim) from the model config; (0, 0) when the config does not say. A hybrid model's
    attention layers are its attention modules, not all of its layers."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    if not layers or not heads:
        return 0, 0
    mixers = sequence_mixers(model)
    if mixers:  # MiniMax's and Kimi's linear-attention classes are named ...Attention too
        layers = sum(
            type(module).__name__.endswith("Attention") and name not in mixers for name, module in model.named_modules()
        )
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return int(layers), int(heads * head_dim)


def _recurrent_flops(model: nn.Module) -> int:
    """Training FLOPs per token of the linear-attention and state-space layers' recurrences: per element of their
    state (linear attention: value heads x key x value head size; Mamba: inner size x state size), independent of the
    sequence's length."""
    flops = 0
    for name, kind in sequence_mixers(model).items():
        mixer = model.get_submodule(name)
        if kind == "linear attention":
            per_element = _DELTA_RULE_FLOPS if "Delta" in type(mixer).__name__ else _SCAN_FLOPS
            flops += per_element * _linear_attention_state(mixer)
        elif kind == "state space":
            flops += _SCAN_FLOPS * mixer.intermediate_size * mixer.ssm_state_size
    return flops


def _linear_attention_state(mixer: nn.Module) -> int:
    """Elements of a linear-attention layer's state, a key x value matrix per value head: Gated DeltaNet sizes them
    apart; Kimi's delta attention and MiniMax's lightning attention have one head size."""
    heads = getattr(mixer, "num_v_heads", None) or getattr(mixer, "num_heads", None) or mixer.num_attention_heads
    key = getattr(mixer, "head_k_dim", None) or mixer.head_dim
    return heads * key * (getattr(mixer, "head_v_dim", None) or mixer.head_dim)


def flops_shape(model: nn.Module) -> tuple[int, int, int, int, int]:
    """What the FLOPs of a token depend on, counted once: frozen and trainable matmul parameters, attention layers and
    width, and the recurrences of linear-attention and state-space layers."""
    return (*matmul_parameters(model), *_attention_shape(model), _recurrent_flops(model))


def flops_per_token(shape: tuple[int, int, int, int, int], seq_len: float) -> float:
    """Training model FLOPs per token: 4·N_frozen + 6·N_trainable + 12·L_attn·d_attn·seq_len + recurrences, for a
    model's ``flops_shape``.

    A weight costs 2 FLOPs per token forward and 2 for the activation gradient; only trainable (LoRA) weights pay 2 more
    for their weight gradient. 12·L_attn·d_attn·T is the attention score/value work of the attention layers (forward
    4·d_attn·T, backward twice that), T the mean processed length; a linear-attention or state-space layer instead
    updates a fixed-size state per token (``_STATE_FLOPS``). Gradient-checkpointing recomputation is not model FLOPs
    (as in PaLM); a MoE model's routed experts count for their active share (``matmul_parameters``): N is N_active."""
    frozen, trainable, layers, attn_dim, recurrent = shape
    return 4.0 * frozen + 6.0 * trainable + 12.0 * layers * attn_dim * seq_len + recurrent


def _synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def measure_matmul_flops(device: torch.device, dtype: torch.dtype) -> float:
    """Best-of-N FLOP/s of square matmuls: 1024² (~2 GFLOP) timed 10 times on the CPU, 4096² twenty times a timing,
    5 timings, elsewhere. The best timing, since a busy machine only ever makes a matmul slower."""
    size, per_timing, timings = (1024, 1, 10) if device.type == "cpu" else (4096, 20, 5)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    a @ b  # warm-up: kernel selection, allocator
    _synchronize(device)
    best = float("inf")
    for _ in range(timings):
        start = time.perf_counter()
        for _ in range(per_timing):
            a @ b
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 * per_timing / best


def peak_flops_per_device(device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """(peak FLOP/s, where it came from) for one device computing in ``dtype``."""
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        name = torch.cuda.get_device_name(device)
        for key, tflops in _NVIDIA_DENSE_TFLOPS:
            if key in name:
                return tflops * 1e12, f"datasheet ({name}, dense {dtype})"
    if device.type == "cpu":
        return _cpu_peak_flops(dtype)
    return measure_matmul_flops(device, dtype), f"measured matmul ({device.type}, {dtype})"


def _cpu_peak_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hf_lora_ds" / "cpu_peak_flops.json"


def _cpu_peak_flops(dtype: torch.dtype) -> tuple[float, str]:
    """The best matmul FLOP/s ever measured on this CPU (model, thread count, dtype), kept in a per-machine cache:
    one measurement on a busy machine is below the real peak (an MFU above 1 follows), the best of all is not."""
    path = _cpu_peak_cache()
    key = f"{platform.machine()} {platform.processor() or _cpu_model()} threads={torch.get_num_threads()} {dtype}"
    try:
        cache = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cache = {}
    best = max(measure_matmul_flops(torch.device("cpu"), dtype), float(cache.get(key, 0.0)))
    if best > float(cache.get(key, 0.0)):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            scratch = path.with_name(f"{path.name}.{os.getpid()}")
            scratch.write_text(json.dumps({**cache, key: best}, indent=1), encoding="utf-8")
            scratch.replace(path)  # atomic: ranks measuring at once never leave a torn file
        except OSError:
            pass  # a read-only home: this run's best measurement still stands
    return best, f"best measured matmul on this machine (cpu, {dtype}; {path})"


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return "cpu"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "cpu")


def _matmul_dtype(args: TrainingArguments, model: nn.Module) -> torch.dtype:
    if args.bf16:
        return torch.bfloat16
    if args.fp16:
        return torch.float16
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


class _TokenCounter:
    """Forward pre-hook that counts the tokens of training micro-batches; device counts stay on the device.

    Per micro-batch: supervised tokens (``labels != -100``, or what the trainer says its forward without labels
    trains: ``LoraSFTTrainer.supervised_in_forward``), real tokens (the attention mask's sum, or without a mask
    every token but each row's trailing padding), padded tokens and sequences. Its one blind spot: a ``compute_loss``
    that pops ``labels`` before the forward (label smoothing) hides the supervised tokens, and those rates are left out.
    """

    def __init__(self) -> None:
        self.labels_missing = False
        self.pad_token_id: int | None = None  # the padding of packed rows is told apart by it (padding_segments)
        self.trainer: Any = None  # read for supervised_in_forward
        self._host: Counter[str] = Counter()
        self._device: dict[str, torch.Tensor] = {}

    def _add(self, key: str, value: torch.Tensor | int) -> None:
        if isinstance(value, int):
            self._host[key] += value
        else:
            self._device[key] = self._device[key] + value if key in self._device else value

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if not module.training:
            return
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is None:
            return
        mask, labels, positions = kwargs.get("attention_mask"), kwargs.get("labels"), kwargs.get("position_ids")
        self._add("padded", input_ids.numel())
        if mask is None and positions is not None:  # packed or padding-free: samples start at position 0
            padding = padding_segments(input_ids, positions, self.pad_token_id)
            self._add("real", input_ids.numel() - padding.sum())
            starts = positions == 0  # a shard may hold only the tail of a padding segment begun on another rank
            self._add("sequences", starts.sum() - ((padding > 0) & starts.any(dim=1)).sum())
        else:
            self._add("real", mask.sum() if mask is not None and mask.dim() == 2 else input_ids.numel())
            self._add("sequences", input_ids.shape[0])
        told = getattr(self.trainer, "supervised_in_forward", None)
        if labels is not None:
            self._add("supervised", (labels != IGNORE_INDEX).sum())
        elif told is not None:  # LoraSFTTrainer's supervised-position loss: no labels reach the forward
            self._add("supervised", told)
        else:
            self.labels_missing = True

    def take(self, device: torch.device) -> dict[str, int]:
        """Counts since the last call, summed over ranks (a collective under torch.distributed)."""
        totals = torch.tensor([self._host[k] for k in _COUNTS], dtype=torch.int64, device=device)
        for index, key in enumerate(_COUNTS):
            if key in self._device:
                totals[index] += self._device[key].to(device)
        self._host.clear()
        self._device.clear()
        if rank_and_world()[1] > 1:
            dist.all_reduce(totals)
        return dict(zip(_COUNTS, (int(v) for v in totals.tolist())))


class _ActiveClock:
    """Wall time with pauses, so evaluation and checkpointing do not dilute training throughput."""

    def __init__(self) -> None:
        self._banked = 0.0
        self._since: float | None = time.perf_counter()

    def pause(self) -> None:
        if self._since is not None:
            self._banked += time.perf_counter() - self._since
            self._since = None

    def resume(self) -> None:
        if self._since is None:
            self._since = time.perf_counter()

    def elapsed(self) -> float:
        return self._banked + (time.perf_counter() - self._since if self._since is not None else 0.0)


class ThroughputCallback(LoggingCallback):
    """Logs ``throughput/*`` per logging window and ``throughput/run_*`` at the end; works in any ``Trainer``.

    >>> trainer = Trainer(model=model, args=args, train_dataset=ds)  # doctest: +SKIP
    >>> ThroughputCallback().attach(trainer)                         # doctest: +SKIP
    """

    def __init__(self, peak_flops: float | None = None) -> None:
        super().__init__()
        self.peak_flops = peak_flops
        self.peak_flops_source = "given" if peak_flops else ""
        self._warned_mfu = False
        self._counter = _TokenCounter()
        self._hook: Any = None
        self._shape = (0, 0, 0, 0, 0)  # flops_shape: (N_frozen, N_trainable, layers, d_attn, state), at train begin
        self._active_params: tuple[int, int] | None = None  # MoE: (N_active, N) of the matmul parameters
        self._vision: VisionFlops | None = None  # a vision-language model's tower and projector, counted as they run
        self._clock = _ActiveClock()
        self._window_start = 0.0
        self._run: Counter[str] = Counter()

    def _rates(self, counts: dict[str, int], seconds: float, prefix: str) -> dict[str, float]:
        if seconds <= 0 or counts["padded"] == 0:
            return {}
        world = rank_and_world()[1]
        tokens_per_s = counts["real"] / seconds
        seq_len = counts["padded"] / max(counts["sequences"], 1)
        model_flops = counts["real"] * flops_per_token(self._shape, seq_len) + counts.get("vision_flops", 0)
        mfu = model_flops / seconds / (world * self.peak_flops)
        metrics = {
            f"throughput/{prefix}tokens_per_second": tokens_per_s,
            f"throughput/{prefix}padding_efficiency": counts["real"] / counts["padded"],
            f"throughput/{prefix}mfu": mfu,
        }
        if mfu > 1 and not self._warned_mfu and rank_and_world()[0] == 0:
            self._warned_mfu = True
            logger.warning(
                "throughput/%smfu %.3f is above 1: the assumed peak of %.4g FLOP/s per device (%s) is below "
                "what this run achieved; pass ThroughputCallback(peak_flops=...) with the real peak",
                prefix,
                mfu,
                self.peak_flops,
                self.peak_flops_source,
            )
        if not self._counter.labels_missing:
            metrics[f"throughput/{prefix}supervised_tokens_per_second"] = counts["supervised"] / seconds
        return metrics

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        model = kwargs["model"]
        self._shape = flops_shape(model)
        if self.peak_flops is None:
            self.peak_flops, self.peak_flops_source = peak_flops_per_device(args.device, _matmul_dtype(args, model))
        if state.is_world_process_zero:
            logger.info("Peak %.3g FLOP/s per device for MFU: %s", self.peak_flops, self.peak_flops_source)
        active, every = sum(self._shape[:2]), sum(matmul_parameters(model, active=False))
        self._active_params = (active, every) if active < every else None
        if self._active_params and state.is_world_process_zero:
            logger.info("MFU counts the active parameters of the experts: N_active %d of %d", active, every)
        processing = kwargs.get("processing_class")
        self._counter.pad_token_id = getattr(getattr(processing, "tokenizer", processing), "pad_token_id", None)
        self._counter.trainer = self._trainer
        self._hook = model.register_forward_pre_hook(self._counter, with_kwargs=True)
        self._vision = VisionFlops(model)
        self._clock = _ActiveClock()
        if args.eval_on_start:
            self._clock.pause()  # resumed by on_evaluate
        self._window_start = 0.0
        self._run.clear()

    def _take(self, device: torch.device) -> dict[str, int]:
        """The window's counts over all ranks, the vision FLOPs of this rank's forwards among them."""
        self._counter._add("vision_flops", self._vision.take())
        return self._counter.take(device)

    def _pause_for_eval_or_save(self, control: TrainerControl) -> None:
        if control.should_evaluate or control.should_save:
            self._clock.pause()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._pause_for_eval_or_save(control)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._pause_for_eval_or_save(control)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if not control.should_save:
            self._clock.resume()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self._clock.resume()

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs=None, **kwargs):
        if self._hook is None or not logs or "loss" not in logs:  # only the trainer's own training logs
            return
        counts = self._take(args.device)
        self._run.update(counts)
        now = self._clock.elapsed()
        metrics = self._rates(counts, now - self._window_start, prefix="")
        self._window_start = now
        self._emit(state, metrics)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self._hook is None:
            return
        self._hook.remove()
        self._hook = None
        self._run.update(self._take(args.device))
        self._vision.remove()
        metrics = self._rates(self._run, self._clock.elapsed(), prefix="run_")
        if metrics:
            seq_len = self._run["padded"] / max(self._run["sequences"], 1)
            metrics["throughput/flops_per_token"] = flops_per_token(self._shape, seq_len)
            metrics["throughput/peak_tflops_per_device"] = self.peak_flops / 1e12
            metrics["throughput/run_tokens"] = self._run["real"]
            if self._run["vision_flops"]:  # the tower's and projector's, per image (callbacks.vision_flops)
                metrics["throughput/run_vision_flops"] = self._run["vision_flops"]
            if self._active_params:  # a MoE model: the FLOPs above are of the active parameters (6·N_active)
                metrics["throughput/run_active_params"], metrics["throughput/run_all_params"] = self._active_params
            if not self._counter.labels_missing:
                metrics["throughput/run_supervised_tokens"] = self._run["supervised"]
        self._emit(state, metrics)

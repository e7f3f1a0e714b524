"""What a Mixture-of-Experts model's experts are, read from its module tree.

transformers 5 builds every MoE family the same way: a block (``mlp``, ``block_sparse_moe``, ``feed_forward``,
``mixer``) holding ``experts`` (the routed experts: fused 3-D weights ``gate_up_proj``/``down_proj`` of shape
(experts, out, in) or (experts, in, out), or one MLP module per expert in remote-code models), a router (``gate``,
``router``, with a ``shared_expert_gate`` beside it in Qwen2-MoE) and, in some families, shared experts that see every
token (``shared_expert``, ``shared_experts``, ``shared_mlp``). So the layout is read from that tree, not from a table
of families, and works on a PEFT-wrapped model too (its wrappers add ``base_layer`` to the names).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

__all__ = ["MoeBlock", "moe_blocks", "expert_weight_names", "experts_per_token", "unwrapped_name"]

_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")
# The config fields that say how many experts each token is routed to (most families; ERNIE; Hunyuan).
_TOP_K_FIELDS = ("num_experts_per_tok", "moe_k", "moe_topk", "top_k")


@dataclass(frozen=True)
class MoeBlock:
    """One MoE block. Names are the unwrapped model's (no ``base_model.model.`` prefix, no ``base_layer``)."""

    path: str  # the block: "model.layers.1.mlp"
    layer: int | None  # its decoder layer
    num_experts: int
    fused: tuple[str, ...]  # the fused 3-D expert weights of ``{path}.experts``: ("gate_up_proj", "down_proj")
    expert_linears: tuple[str, ...]  # per-expert Linear modules, full names ("...experts.0.w1"), when not fused
    shared: tuple[str, ...]  # shared-expert modules, full names
    routers: tuple[str, ...]  # the router and any other gate of the block, full names

    @property
    def experts(self) -> str:
        return f"{self.path}.experts"

    def fused_parameters(self) -> list[str]:
        return [f"{self.experts}.{name}" for name in self.fused]


def unwrapped_name(name: str) -> str:
    """``name`` as the base model has it: PEFT's prefix and wrapper levels removed."""
    name = name.removeprefix("base_model.model.")
    return re.sub(r"\.base_layer(?=\.|$)", "", name)


def moe_blocks(model: torch.nn.Module) -> list[MoeBlock]:
    """Every MoE block of ``model`` (raw or PEFT-wrapped), in module order; empty for a dense model."""
    # A wrapped module's name comes again for each wrapper level; the innermost, the model's own module, stays.
    modules = {unwrapped_name(name): module for name, module in model.named_modules()}
    blocks = []
    for name, module in modules.items():
        if not name.endswith(".experts"):
            continue
        fused = _fused_weights(module)
        linears = [] if fused else [n for n in _inside(modules, name) if isinstance(modules[n], torch.nn.Linear)]
        if not fused and not (isinstance(module, torch.nn.ModuleList) and linears):
            continue  # "experts" that are neither (JetMoe's attention experts)
        path = name.removesuffix(".experts")
        children = [child for child in _children(modules, path) if child != name]
        shared = tuple(child for child in children if _is_shared_expert(child, modules[child]))
        layer = _LAYER.search(name + ".")
        blocks.append(
            MoeBlock(
                path=path,
                layer=int(layer.group(1)) if layer else None,
                num_experts=int(_shape(getattr(module, fused[0]))[0]) if fused else len(module),
                fused=tuple(fused),
                expert_linears=tuple(linears),
                shared=shared,
                routers=tuple(child for child in children if child not in shared),
            )
        )
    return blocks


def expert_weight_names(blocks: list[MoeBlock]) -> list[str]:
    """The names targets give expert weights: fused weights' own names, per-expert Linear modules' last names."""
    names = {name for block in blocks for name in block.fused}
    names |= {linear.rsplit(".", 1)[-1] for block in blocks for linear in block.expert_linears}
    return sorted(names)


def experts_per_token(config: PretrainedConfig | None) -> int | None:
    """How many routed experts each token goes through (None when the config does not say, or there is none)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for field in _TOP_K_FIELDS:
        value = getattr(text, field, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _fused_weights(module: torch.nn.Module) -> list[str]:
    """The module's own 3-D parameters (biases are 2-D), also while PEFT's ParamWrapper parametrizes them."""
    names = [name for name, param in module.named_parameters(recurse=False) if len(_shape(param)) == 3]
    for name, parametrization in getattr(module, "parametrizations", {}).items():
        if len(_shape(parametrization.original)) == 3:
            names.append(name)
    return names


def _shape(param: torch.Tensor) -> tuple[int, ...]:
    return tuple(getattr(param, "ds_shape", param.shape))  # ZeRO-3 leaves an empty local shard


def _inside(modules: dict[str, torch.nn.Module], path: str) -> list[str]:
    """The modules under ``path``, LoRA's own layers left out."""
    return [name for name in modules if name.startswith(path + ".") and ".lora_" not in name]


def _children(modules: dict[str, torch.nn.Module], path: str) -> list[str]:
    return [name for name in _inside(modules, path) if "." not in name[len(path) + 1 :]]


def _is_shared_expert(name: str, module: torch.nn.Module) -> bool:
    """A shared expert is named so; a gate that scales it by a learned score has one output (Qwen2-MoE's
    shared_expert_gate) and is a router."""
    gate = isinstance(module, torch.nn.Linear) and module.out_features == 1
    return "shared" in name.rsplit(".", 1)[-1] and not gate

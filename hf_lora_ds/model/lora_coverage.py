"""Where the LoRA adapters landed: per decoder layer and module kind, the linear modules adapted and those left out.

PEFT raises only when no module matches the targets. Targets that match some layers only (hybrid models whose
linear-attention layers name their projections differently) or no expert weights (MoE models whose experts are
fused 3-D parameters, which PEFT's ``all-linear`` does not reach) train silently on a fraction of the model. After
wrapping, every linear module inside a decoder layer is listed as adapted or not, and on a MoE model every routed
expert weight (a fused 3-D one once for all its experts), the shared experts apart and the router only when adapted;
printed as one compact table at start, saved for the run report and shown by the audit with ``--model``. On a
vision-language model the table is the language model's, and one line for the vision tower and one for the projector
say whether each is frozen, adapted (how many of its linear modules) or trained in full (hf_lora_ds.vision.modules).
A run whose targets leave whole layers without any adapter, or skip the experts most layers have, stops with one
line unless ``--lora_allow_partial`` (or, for the experts, ``--lora_target_experts none``); a deliberate partial
choice (``q_proj,v_proj``) trains with one line saying which module kinds and names it leaves out.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from peft import LoraConfig
from peft.tuners.lora.layer import ParamWrapper
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import ModulesToSaveWrapper
from transformers import AutoModelForCausalLM, PretrainedConfig

from hf_lora_ds.config.vision import FROZEN_VISION, VisionTraining
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.experts import MoeBlock, moe_blocks, unwrapped_name
from hf_lora_ds.model.layer_kinds import sequence_mixers
from hf_lora_ds.model.lora import shape_config, wrap_with_lora
from hf_lora_ds.vision.modules import LANGUAGE_MODEL, PROJECTOR, TOWER, vision_model_class, vision_parts

__all__ = ["LoraCoverage", "PartCoverage", "Site", "lora_coverage", "meta_coverage", "COVERAGE_FILE"]

COVERAGE_FILE = "lora_coverage.txt"  # in output_dir, for the run report
MIXER_KINDS = ("attention", "linear attention", "state space", "short convolution")
KINDS = (*MIXER_KINDS, "mlp", "experts", "shared", "router", "other")
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class Site:
    """A linear module (or a fused expert weight block) of a decoder layer and whether LoRA adapts it."""

    layer: int
    kind: str
    name: str
    adapted: bool


@dataclass(frozen=True)
class PartCoverage:
    """The vision tower or the projector of a vision-language model: its linear modules with an adapter, and whether
    PEFT trains it in full (``modules_to_save``)."""

    part: str
    modules: tuple[str, ...]
    adapted: int
    linear: int
    full: bool

    def line(self) -> str:
        if self.full:
            state = "trained in full"
        elif self.adapted:
            state = f"LoRA on {self.adapted}/{self.linear} linear modules"
        else:
            state = f"frozen, no LoRA (0/{self.linear} linear modules)"
        return f"{self.part} ({', '.join(self.modules)}): {state}"


def lora_coverage(model: torch.nn.Module) -> LoraCoverage:
    """The coverage of a PEFT-wrapped model: its adapter layers and the linear modules left as they were; on a MoE model
    each routed-expert weight too (a fused one once for all its experts), the routers only when adapted; on a
    vision-language model the decoder layers of its language model, and its vision parts apart."""
    parts = vision_parts(model)
    blocks = moe_blocks(model)
    owners = _owner_kinds(model)
    wrapped = {(unwrapped_name(n), m.parameter_name) for n, m in model.named_modules() if isinstance(m, ParamWrapper)}
    sites = [
        Site(block.layer, "experts", f"{name} (fused)", (block.experts, name) in wrapped)
        for block in blocks
        if block.layer is not None
        for name in block.fused
    ]
    tuned: list[str] = []
    vision: dict[str, list[int]] = {TOWER: [0, 0, 0], PROJECTOR: [0, 0, 0]}  # adapted, linear, wrapped in full
    for path, module in model.named_modules():
        if any(path.startswith(prefix) for prefix in tuned):
            continue  # the adapter's own lora_A/lora_B and the wrapped base layer, a full module's copies
        adapted = isinstance(module, BaseTunerLayer)
        if adapted or isinstance(module, ModulesToSaveWrapper):
            tuned.append(path + ".")
        part = parts.part_of(path) if parts else LANGUAGE_MODEL
        if part in vision:
            vision[part][0] += adapted
            vision[part][1] += adapted or isinstance(module, torch.nn.Linear)
            vision[part][2] += isinstance(module, ModulesToSaveWrapper)
            continue
        match = _LAYER.search(path)
        kind = _kind(unwrapped_name(path), blocks, owners) if match else None
        fused = isinstance(module, ParamWrapper) and kind == "experts"
        if fused or not (adapted or isinstance(module, torch.nn.Linear)):
            continue  # a fused expert weight (counted above), or no linear layer
        if match and (adapted or kind != "router"):
            sites.append(Site(int(match.group(1)), kind, _name(match.group(2)), adapted))
    roots = {TOWER: (parts.tower,), PROJECTOR: parts.projectors} if parts else {}
    vision_parts_coverage = [
        PartCoverage(part, tuple(unwrapped_name(root) for root in roots[part]), adapted, linear, bool(full))
        for part, (adapted, linear, full) in vision.items()
        if part in roots
    ]
    return LoraCoverage(sorted(sites, key=lambda site: site.layer), vision_parts_coverage)


def meta_coverage(
    config: PretrainedConfig,
    lora: LoraConfig,
    trust_remote_code: bool = False,
    vision: VisionTraining = FROZEN_VISION,
) -> LoraCoverage:
    """The coverage ``lora`` (and ``vision``, for a vision-language model) would give a model of ``config``, built on
    the meta device: no weights are read, so the audit can show it for any model size."""
    with torch.random.fork_rng(), torch.device("meta"):
        vision_class = vision_model_class(config)
        if vision_class is None:
            base = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        else:
            base = vision_class(config)
        return lora_coverage(wrap_with_lora(base, shape_config(lora), vision))


def _owner_kinds(model: torch.nn.Module) -> dict[str, str]:
    """The token mixers and MLPs of ``model`` (unwrapped names) by kind: the linear-attention, state-space and
    short-convolution layers by what they are made of (hf_lora_ds.model.layer_kinds), attention and MLP modules by
    their class (Nemotron-H names every one of them ``mixer``)."""
    owners = {unwrapped_name(name): kind for name, kind in sequence_mixers(model).items()}
    for name, module in model.named_modules():
        cls = type(module).__name__
        kind = "attention" if cls.endswith("Attention") else "mlp" if cls.endswith("MLP") else None
        if kind and unwrapped_name(name) not in owners:
            owners[unwrapped_name(name)] = kind
    return owners


def _kind(path: str, blocks: list[MoeBlock], owners: dict[str, str]) -> str:
    """A module's kind: inside a MoE block by the block's layout, inside a token mixer or MLP by that module, elsewhere
    by its name's parts."""
    for block in blocks:
        if path.startswith(block.experts + "."):
            return "experts"
        if path.startswith(tuple(shared + "." for shared in block.shared)):
            return "shared"
        if path.startswith(tuple(router + "." for router in block.routers)) or path in block.routers:
            return "router"
    owner = next((kind for owner, kind in owners.items() if path.startswith(owner + ".")), None)
    if owner:
        return owner
    parts = path.split(".")
    if "experts" in parts:
        return "experts"
    if any("attn" in part or "attention" in part for part in parts):
        return "attention"
    if any(part in ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe") for part in parts):
        return "mlp"
    return "other"


def _name(rest: str) -> str:
    """The module's name as targets name it (a numbered expert's ``w1`` is ``w1`` in every expert)."""
    return rest.split(".")[-1]


@dataclass
class LoraCoverage:
    sites: list[Site]
    vision: list[PartCoverage] = field(default_factory=list)  # the vision parts of a vision-language model

    @property
    def layers(self) -> list[int]:
        return sorted({site.layer for site in self.sites})

    def _cells(self) -> dict[int, dict[str, tuple[int, int]]]:
        cells: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        for site in self.sites:
            cells[site.layer][site.kind][0] += site.adapted
            cells[site.layer][site.kind][1] += 1
        return {layer: {kind: tuple(count) for kind, count in kinds.items()} for layer, kinds in cells.items()}

    def table(self) -> str:
        """Adapted/all per layer and kind, consecutive identical layers as one row."""
        cells = self._cells()
        kinds = [kind for kind in KINDS if any(kind in row for row in cells.values())]
        rows: list[tuple[list[int], tuple]] = []
        for layer in self.layers:
            key = tuple(cells[layer].get(kind, (0, 0)) for kind in kinds)
            if rows and rows[-1][1] == key and rows[-1][0][-1] == layer - 1:
                rows[-1][0].append(layer)
            else:
                rows.append(([layer], key))
        experts = "; experts: routed-expert weights, a fused one once for all experts" if "experts" in kinds else ""
        of = " of the language model" if self.vision else ""
        lines = [
            f"LoRA coverage (adapted/linear modules per decoder layer{of}{experts}):",
            "layers   " + "".join(f"{k:<{_width(k)}}" for k in kinds),
        ]
        for group, key in rows:
            span = str(group[0]) if len(group) == 1 else f"{group[0]}-{group[-1]}"
            cells = (f"{f'{a}/{n}' if n else '-':<{_width(k)}}" for k, (a, n) in zip(kinds, key))
            lines.append(f"{span:<9}" + "".join(cells))
        left = self.left_out()
        if left:
            lines.append("left out: " + "; ".join(f"{kind} {', '.join(names)}" for kind, names in left.items()))
        lines += [part.line() for part in self.vision]
        return "\n".join(line.rstrip() for line in lines)

    def left_out(self) -> dict[str, list[str]]:
        """Per kind, the module names no layer adapts."""
        adapted = {(site.kind, site.name) for site in self.sites if site.adapted}
        left: dict[str, list[str]] = {}
        for site in sorted(self.sites, key=lambda site: KINDS.index(site.kind)):
            if (site.kind, site.name) not in adapted and site.name not in left.get(site.kind, []):
                left.setdefault(site.kind, []).append(site.name)
        return left

    def problem(self, experts_off: bool = False) -> str | None:
        """Layers left without any adapter, or experts most layers have but LoRA skips (unless ``experts_off``: left
        out on purpose, ``--lora_target_experts none``); None when neither."""
        bare = [layer for layer in self.layers if not any(s.adapted for s in self.sites if s.layer == layer)]
        if bare:
            return (
                f"LoRA adapts no module of decoder layers {_ranges(bare)} (of {len(self.layers)}), "
                "so they are not trained"
            )
        moe = {site.layer for site in self.sites if site.kind == "experts"}
        tuned = {site.layer for site in self.sites if site.kind == "experts" and site.adapted}
        if not experts_off and len(moe) > len(self.layers) / 2 and len(tuned) <= len(moe) / 2:
            names = ", ".join(self.left_out().get("experts", ["experts"]))
            return (
                f"LoRA adapts the experts of {len(tuned)} of the {len(moe)} MoE layers ({names} left out), so the "
                "experts, most of the model, are not trained (--lora_target_experts names them; none leaves them "
                "out on purpose)"
            )
        return None

    def check(self, allow_partial: bool, targets: str, experts_off: bool = False) -> str | None:
        """Raise a one-line ``UserError`` for a ``problem`` unless ``allow_partial``; else the one line to print
        about what the targets leave out (None when they leave nothing out). ``experts_off``: see ``problem``."""
        problem = self.problem(experts_off)
        if problem and not allow_partial:
            raise UserError(
                f"--lora_target_modules {targets}: {problem}; target those modules, or pass --lora_allow_partial true "
                "to train anyway (the coverage table above shows where the adapters are)"
            )
        left = self.left_out()
        kinds = "; ".join(f"{kind} ({', '.join(names)})" for kind, names in left.items())
        lines = [f"LoRA targets {targets} leave out: {kinds}"] if left else []
        lines += [f"{problem} (allowed by --lora_allow_partial)"] if problem else []
        return "; ".join(lines) or None


def _width(kind: str) -> int:
    return max(11, len(kind) + 2)


def _ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    groups: list[list[int]] = []
    for n in numbers:
        if groups and groups[-1][-1] == n - 1:
            groups[-1].append(n)
        else:
            groups.append([n])
    return ", ".join(str(g[0]) if len(g) == 1 else f"{g[0]}-{g[-1]}" for g in groups)

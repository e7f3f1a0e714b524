"""Where the LoRA adapters landed: per decoder layer and module kind, the linear modules adapted and those left out.

PEFT raises only when no module matches the targets. Targets that match some layers only (hybrid models whose
linear-attention layers name their projections differently) or no expert weights (MoE models whose experts are
fused 3-D parameters, which ``all-linear`` does not reach) train silently on a fraction of the model. After
wrapping, every linear module inside a decoder layer (and every fused expert weight block) is listed as adapted or
not, printed as one compact table at start, saved for the run report and shown by the audit with ``--model``.
A run whose targets leave whole layers without any adapter, or skip the experts most layers have, stops with one
line unless ``--lora_allow_partial``; a deliberate partial choice (``q_proj,v_proj``) trains with one line saying
which module kinds and names it leaves out.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from transformers import AutoModelForCausalLM, PretrainedConfig

from hf_lora_ds.errors import UserError
from hf_lora_ds.model.lora import parse_targets

__all__ = ["LoraCoverage", "Site", "lora_coverage", "meta_coverage", "COVERAGE_FILE"]

COVERAGE_FILE = "lora_coverage.txt"  # in output_dir, for the run report
KINDS = ("attention", "mlp", "experts", "other")
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class Site:
    """A linear module (or a fused expert weight block) of a decoder layer and whether LoRA adapts it."""

    layer: int
    kind: str
    name: str
    adapted: bool


def lora_coverage(model: torch.nn.Module) -> LoraCoverage:
    """The coverage of a PEFT-wrapped model: its adapter layers and the linear modules left as they were."""
    sites, tuned = [], []
    for path, module in model.named_modules():
        if any(path.startswith(prefix) for prefix in tuned):
            continue  # the adapter's own lora_A/lora_B and the wrapped base layer
        adapted = isinstance(module, BaseTunerLayer)
        fused = [name for name, param in module.named_parameters(recurse=False) if param.dim() == 3]
        if adapted:
            tuned.append(path + ".")
        elif not (isinstance(module, torch.nn.Linear) or fused):
            continue
        match = _LAYER.search(path)
        if match:
            name = "/".join(fused) + " (fused)" if fused else _name(match.group(2))
            sites.append(Site(int(match.group(1)), _kind(match.group(2)), name, adapted))
    return LoraCoverage(sites)


def meta_coverage(config: PretrainedConfig, targets: str, trust_remote_code: bool = False) -> LoraCoverage:
    """The coverage ``targets`` would give a model of ``config``, built on the meta device: no weights are read, so
    the audit can show it for any model size."""
    with torch.random.fork_rng(), torch.device("meta"):
        base = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        return lora_coverage(get_peft_model(base, LoraConfig(r=8, target_modules=parse_targets(targets))))


def _kind(rest: str) -> str:
    parts = rest.split(".")
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
        lines = [
            "LoRA coverage (adapted/linear modules per decoder layer):",
            "layers   " + "".join(f"{k:<11}" for k in kinds),
        ]
        for group, key in rows:
            span = str(group[0]) if len(group) == 1 else f"{group[0]}-{group[-1]}"
            lines.append(f"{span:<9}" + "".join(f"{f'{a}/{n}':<11}" for a, n in key))
        left = self.left_out()
        if left:
            lines.append("left out: " + "; ".join(f"{kind} {', '.join(names)}" for kind, names in left.items()))
        return "\n".join(line.rstrip() for line in lines)

    def left_out(self) -> dict[str, list[str]]:
        """Per kind, the module names no layer adapts."""
        adapted = {(site.kind, site.name) for site in self.sites if site.adapted}
        left: dict[str, list[str]] = {}
        for site in self.sites:
            if (site.kind, site.name) not in adapted and site.name not in left.get(site.kind, []):
                left.setdefault(site.kind, []).append(site.name)
        return left

    def problem(self) -> str | None:
        """Layers left without any adapter, or experts most layers have but LoRA skips; None when neither."""
        bare = [layer for layer in self.layers if not any(s.adapted for s in self.sites if s.layer == layer)]
        if bare:
            return (
                f"LoRA adapts no module of decoder layers {_ranges(bare)} (of {len(self.layers)}), "
                "so they are not trained"
            )
        moe = {site.layer for site in self.sites if site.kind == "experts"}
        tuned = {site.layer for site in self.sites if site.kind == "experts" and site.adapted}
        if len(moe) > len(self.layers) / 2 and len(tuned) <= len(moe) / 2:
            names = ", ".join(self.left_out().get("experts", ["experts"]))
            return (
                f"LoRA adapts the experts of {len(tuned)} of the {len(moe)} MoE layers ({names} left out), so the "
                "experts, most of the model, are not trained"
            )
        return None

    def check(self, allow_partial: bool, targets: str) -> str | None:
        """Raise a one-line ``UserError`` for a ``problem`` unless ``allow_partial``; else the one line to print
        about what the targets leave out (None when they leave nothing out)."""
        problem = self.problem()
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


def _ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    groups: list[list[int]] = []
    for n in numbers:
        if groups and groups[-1][-1] == n - 1:
            groups[-1].append(n)
        else:
            groups.append([n])
    return ", ".join(str(g[0]) if len(g) == 1 else f"{g[0]}-{g[-1]}" for g in groups)

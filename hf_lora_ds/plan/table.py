"""The plan as people read it: one table row per configuration, the recommendation, and one line for run_sft."""

from __future__ import annotations

from collections.abc import Sequence

from hf_lora_ds.plan.estimate import ITEM_NOTES
from hf_lora_ds.plan.planner import PlanRow

__all__ = ["format_gib", "format_table", "plan_line"]


def format_gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"


def _config_name(row: PlanRow) -> str:
    if row.config == "none":
        return "no DeepSpeed"
    split = f" + SP {row.sequence_parallel}" if row.sequence_parallel > 1 else ""
    if not row.config.endswith(".json"):
        return row.config + split
    return f"{'fsdp_configs' if row.config.startswith('fsdp') else 'ds_configs'}/{row.config}{split}"


def _fits(row: PlanRow) -> str:
    sign = "+" if row.margin_bytes >= 0 else "-"
    return f"{'yes' if row.fits else 'no'} ({sign}{format_gib(abs(row.margin_bytes))})"


def format_table(
    rows: Sequence[PlanRow],
    recommended: PlanRow | None,
    more_devices: PlanRow | None = None,
    on_accelerator: bool = True,
) -> str:
    """The table, then the recommendation; when nothing fits, ``more_devices`` is the row of the smallest
    sequence-parallel group of more devices (machines, ``on_accelerator`` False) that would hold the run."""
    header = ("configuration", "grad. ckpt", "per device", "host per node", "fits (margin)", "max batch")
    table = [header] + [
        (
            _config_name(row),
            "yes" if row.gradient_checkpointing else "no",
            format_gib(row.estimate.device_bytes),
            format_gib(row.estimate.host_bytes),
            _fits(row),
            str(row.max_batch_size),
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * width for width in widths))
    if recommended is None:
        lines.append(
            "\nNothing fits: lower --per_device_train_batch_size or --max_length, use more devices, or --load_in_4bit."
        )
        if more_devices is not None:
            size, kind = more_devices.sequence_parallel, "devices" if on_accelerator else "machines like this one"
            lines.append(
                f"With {size} {kind}, one sequence split over all of them (--sequence_parallel_size {size} "
                f"--deepspeed {more_devices.config.removesuffix('.json')}): {plan_line(more_devices)}"
            )
    else:
        lines.append(f"\nRecommended: {plan_line(recommended)}")
        if recommended.sequence_parallel > 1:
            lines.append(
                f"  (the sequences do not fit whole on one device: run with --sequence_parallel_size "
                f"{recommended.sequence_parallel}, each sequence split over that many ranks)"
            )
        lines += [_item_line(name, value) for name, value in recommended.estimate.device_items.items()]
    return "\n".join(lines)


def _item_line(name: str, value: int) -> str:
    """``  allocator reserve: 1.20 GiB (cached and rounded blocks ...)``: the terms a name alone does not explain."""
    note = ITEM_NOTES.get(name)
    return f"  {name}: {format_gib(value)}" + (f" ({note})" if note else "")


def plan_line(row: PlanRow) -> str:
    """``ds_configs/stage2.json without gradient checkpointing: 12.31 GiB per device, host 30.20 GiB per node,
    fits (+8.69 GiB); max batch 16``."""
    checkpointing = "with" if row.gradient_checkpointing else "without"
    verdict = "fits" if row.fits else "does NOT fit"
    return (
        f"{_config_name(row)} {checkpointing} gradient checkpointing: {format_gib(row.estimate.device_bytes)} per "
        f"device, host {format_gib(row.estimate.host_bytes)} per node, {verdict} "
        f"({'+' if row.margin_bytes >= 0 else '-'}{format_gib(abs(row.margin_bytes))}); "
        f"max batch {row.max_batch_size}"
    )

"""The plan as people read it: a row per configuration with its shipped path, the recommendation itemised, and the
one line run_sft prints."""

from __future__ import annotations

from hf_lora_ds.plan.estimate import ALLOCATOR_RESERVE_ITEM, CUDA_CONTEXT_ITEM, ITEM_NOTES
from hf_lora_ds.plan.table import format_table, plan_line
from tests.plan.test_planner import row


def test_the_line_names_the_shipped_file_the_verdict_and_the_margin():
    assert plan_line(row("stage2.json", True)) == (
        "ds_configs/stage2.json without gradient checkpointing: 1.00 GiB per device, host 2.00 GiB per node, fits "
        "(+0.50 GiB); max batch 4"
    )
    assert plan_line(row("none", False)).startswith("no DeepSpeed without gradient checkpointing")
    assert "does NOT fit (-0.50 GiB)" in plan_line(row("fsdp2.json", False))
    assert plan_line(row("fsdp2.json", False)).startswith("fsdp_configs/fsdp2.json")


def test_the_table_lists_every_row_and_itemises_the_recommendation():
    rows = [row("none", False), row("stage2.json", True)]
    table = format_table(rows, rows[1])
    lines = table.splitlines()
    assert lines[0].split() == [
        "configuration",
        "grad.",
        "ckpt",
        "per",
        "device",
        "host",
        "per",
        "node",
        "fits",
        "(margin)",
        "max",
        "batch",
    ]
    assert lines[2].startswith("no DeepSpeed") and "no (-0.50 GiB)" in lines[2]
    assert f"Recommended: {plan_line(rows[1])}" in table and "  weights: 1.00 GiB" in table
    assert "Nothing fits" in format_table(rows[:1], None)


def test_the_table_says_what_each_gpu_term_is():
    recommended = row("stage3.json", False)
    recommended.estimate.device_items.update({ALLOCATOR_RESERVE_ITEM: 2**30, CUDA_CONTEXT_ITEM: 2**29})
    table = format_table([recommended], recommended)
    assert f"  {ALLOCATOR_RESERVE_ITEM}: 1.00 GiB ({ITEM_NOTES[ALLOCATOR_RESERVE_ITEM]})" in table
    assert f"  {CUDA_CONTEXT_ITEM}: 0.50 GiB ({ITEM_NOTES[CUDA_CONTEXT_ITEM]})" in table
    assert "  weights: 1.00 GiB\n" in table + "\n"  # a self-explaining term gets no note

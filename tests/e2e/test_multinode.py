"""Two "nodes" on loopback, one rank each: what a two-machine job does, under torchrun (``--nnodes 2 --node_rank
0|1``) and under the deepspeed launcher (a two-host hostfile, ``--no_ssh --node_rank 0|1``)."""

from __future__ import annotations

import json

import pytest

from tests.e2e.launching import (
    ENTRY,
    REPO,
    check_ok,
    check_own_samples,
    check_process_groups_released,
    check_run,
    run_two_nodes,
    sft_args,
)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["torchrun", "deepspeed"])
def test_two_nodes_on_loopback(kind, tiny_model_dir, sum_data, tmp_path):
    out = tmp_path / "out"
    # The generation eval is checked across the torchrun nodes only; under ZeRO-3 here it would double the time.
    evaluated = kind == "torchrun"
    extra = [] if evaluated else ["--deepspeed", str(REPO / "ds_configs" / "stage3.json")]
    args = sft_args(tiny_model_dir, sum_data, out, *extra, eval_file=evaluated)
    nodes = run_two_nodes(kind, [str(ENTRY), *args], tmp_path)
    for node in nodes:
        check_ok(node)
    print(f"{kind}, 2 nodes x 1 rank: {nodes[0].seconds:.1f} s")
    check_run(out, nodes[0].log, tiny_model_dir, world_size=2, evaluated=evaluated)
    assert "world size" not in nodes[1].log, "only global rank 0 prints"
    check_process_groups_released(out, 2)
    check_own_samples(out, 2, num_records=len(json.loads(sum_data["train"].read_text())))

"""The sequence-parallel loss's contract on two gloo processes, DeepSpeed's divisor per ZeRO stage, and the
accelerate config the flag becomes. The whole path (Ulysses, DeepSpeed, Trainer) is tests/e2e/test_sequence_parallel.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hf_lora_ds.errors import UserError
from hf_lora_ds.training.sequence_parallel import (
    deepspeed_gradient_divisor,
    parallelism_config,
    sequence_parallel_loss,
    supervised_tokens_in_shards,
)

# Two ranks hold the two halves of one sequence: rank r's tokens contribute x_r * w to the summed loss.
SHARD_INPUTS = (torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0]))
TOKENS = 4  # supervised tokens of the whole (global) batch


def _rank(rank: int, init_file: str, divisor: int, differentiable_gather: bool, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))  # fmt: skip
    weight = torch.tensor([0.5, 0.25], requires_grad=True)
    shard_loss = (SHARD_INPUTS[rank] * weight).sum() / TOKENS
    if differentiable_gather:  # transformers' deepspeed_sp_compute_loss: every rank backpropagates the whole sum
        loss = torch.stack(torch.distributed.nn.functional.all_gather(shard_loss)).sum()
    else:
        loss = sequence_parallel_loss(shard_loss, dist.group.WORLD, deepspeed_divisor=divisor, data_parallel=1)
    loss.backward()
    gradient = weight.grad.clone()
    dist.all_reduce(gradient)  # what DeepSpeed does with it: sum over every rank, then divide
    results.put((rank, loss.item(), (gradient / divisor).tolist()))
    dist.destroy_process_group()


def two_ranks(tmp_path, divisor: int, differentiable_gather: bool = False) -> dict[int, tuple[float, list[float]]]:
    """Loss value and reduced gradient per rank. Forked, so the ranks start with this process's imports (spawned
    ones re-import the package: minutes on a loaded 2-core machine, against a second)."""
    results = mp.get_context("fork").SimpleQueue()
    init_file = tmp_path / f"init-{divisor}-{differentiable_gather}"  # a fresh rendezvous file per group
    mp.start_processes(_rank, args=(str(init_file), divisor, differentiable_gather, results), nprocs=2,
                       start_method="fork")  # fmt: skip
    found = [results.get() for _ in range(2)]
    return {rank: (value, gradient) for rank, value, gradient in found}


def test_each_rank_backpropagates_its_shard_and_reports_the_sequence(tmp_path):
    """One process would see loss sum(x * w) / 4 = (0.5 + 0.5 + 1.5 - 0.25) / 4 and gradient (x_0 + x_1) / 4."""
    one_process_loss = sum((x * torch.tensor([0.5, 0.25])).sum() for x in SHARD_INPUTS).item() / TOKENS
    one_process_gradient = (sum(SHARD_INPUTS) / TOKENS).tolist()
    for divisor in (1, 2):  # ZeRO 0-2 at SP 2 on 2 ranks divide by 1; ZeRO-3's reduce-scatter by 2
        ranks = two_ranks(tmp_path, divisor)
        for value, gradient in ranks.values():
            assert value == pytest.approx(one_process_loss)
            assert gradient == pytest.approx(one_process_gradient)


def test_a_differentiable_gather_doubles_the_gradient(tmp_path):
    """The cause the loss works around (DeepSpeed issue 5248): with transformers' gathered loss each rank's
    backward carries both shards, and DeepSpeed's sum over the group doubles the gradient at SP 2."""
    ranks = two_ranks(tmp_path, divisor=1, differentiable_gather=True)
    for _, gradient in ranks.values():
        assert gradient == pytest.approx((2 * sum(SHARD_INPUTS) / TOKENS).tolist())


def test_deepspeed_divides_by_the_data_parallel_size_except_zero3s_reduce_scatter():
    assert deepspeed_gradient_divisor({"zero_optimization": {"stage": 2}}, world_size=8, sequence_parallel_size=2) == 4
    assert deepspeed_gradient_divisor({}, world_size=8, sequence_parallel_size=4) == 2  # ZeRO-0
    assert deepspeed_gradient_divisor({"zero_optimization": {"stage": 3}}, world_size=8, sequence_parallel_size=2) == 8
    with pytest.raises(UserError, match="reduce_scatter false"):
        deepspeed_gradient_divisor({"zero_optimization": {"stage": 3, "reduce_scatter": False}}, 8, 2)


def test_trained_tokens_of_the_shards_count_once():
    shards = [{"shift_labels": torch.tensor([[-100, 5, 6], [7, -100, -100]])}, {"shift_labels": torch.tensor([[1, 2, -100]])}]
    assert supervised_tokens_in_shards(shards, torch.device("cpu")).item() == 5


def test_the_flag_becomes_accelerates_deepspeed_sequence_parallelism():
    assert parallelism_config(1, "sdpa") is None
    config = parallelism_config(2, "sdpa")
    assert (config.sp_size, config.sp_backend, config.sp_enabled) == (2, "deepspeed", True)
    assert config.sp_handler.sp_seq_length_is_variable and config.sp_handler.sp_attn_implementation == "sdpa"

"""The sequence-parallel loss's contract on two gloo processes, DeepSpeed's divisor per ZeRO stage, and the
accelerate config the flag becomes. The whole path (Ulysses, DeepSpeed, Trainer) is tests/e2e/test_sequence_parallel.py.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hf_lora_ds.config.engine import parallelism_config
from hf_lora_ds.errors import UserError
from hf_lora_ds.training.sequence_parallel import (
    deepspeed_gradient_divisor,
    sequence_parallel_loss,
    supervised_tokens_in_shards,
)

# Two ranks hold the two halves of one sequence: rank r's tokens contribute x_r * w to the summed loss.
SHARD_INPUTS = (torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0]))
TOKENS = 4  # supervised tokens of the whole (global) batch
RANKS_DEADLINE_S = 60  # both ranks of a case, from fork to exit; a hung collective fails the test instead


def _rank(rank: int, init_file: str, work, args: tuple, results) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2, timeout=timedelta(seconds=30)
    )
    results.put((rank, work(rank, *args)))
    dist.destroy_process_group()


def on_two_ranks(tmp_path, work, *args) -> dict:
    """``work(rank, *args)`` on two gloo ranks, by rank. Forked, so the ranks start with this process's imports
    (spawned ones re-import the package: minutes on a loaded 2-core machine, against a second); killed, and the
    test failed, when they have not both finished within ``RANKS_DEADLINE_S``."""
    context = mp.get_context("fork")
    results = context.SimpleQueue()
    init_file = tmp_path / f"init-{uuid.uuid4().hex}"  # a fresh rendezvous file per group
    ranks = mp.start_processes(
        _rank, args=(str(init_file), work, args, results), nprocs=2, join=False, start_method="fork"
    )
    deadline = time.monotonic() + RANKS_DEADLINE_S
    while not ranks.join(timeout=max(deadline - time.monotonic(), 0)):
        if time.monotonic() >= deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail(f"the two gloo ranks did not finish within {RANKS_DEADLINE_S} s")
    return dict(results.get() for _ in range(2))


def _loss_and_gradient(rank: int, divisor: int, data_parallel: int, differentiable_gather: bool):
    weight = torch.tensor([0.5, 0.25], requires_grad=True)
    shard_loss = (SHARD_INPUTS[rank] * weight).sum() / TOKENS
    if differentiable_gather:  # transformers' deepspeed_sp_compute_loss: every rank backpropagates the whole sum
        loss = torch.stack(torch.distributed.nn.functional.all_gather(shard_loss)).sum()
    else:
        loss = sequence_parallel_loss(
            shard_loss, dist.group.WORLD, deepspeed_divisor=divisor, data_parallel=data_parallel
        )
    loss.backward()
    gradient = weight.grad.clone()
    dist.all_reduce(gradient)  # what DeepSpeed does with it: sum over every rank, then divide
    return loss.item(), (gradient / divisor).tolist()


def two_ranks(tmp_path, divisor: int, data_parallel: int = 1, differentiable_gather: bool = False) -> dict:
    """Loss value and reduced gradient per rank."""
    return on_two_ranks(tmp_path, _loss_and_gradient, divisor, data_parallel, differentiable_gather)


def test_each_rank_backpropagates_its_shard_and_reports_the_sequence(tmp_path):
    """One process would see loss sum(x * w) / 4 = (0.5 + 0.5 + 1.5 - 0.25) / 4 and gradient (x_0 + x_1) / 4."""
    one_process_loss = sum((x * torch.tensor([0.5, 0.25])).sum() for x in SHARD_INPUTS).item() / TOKENS
    one_process_gradient = (sum(SHARD_INPUTS) / TOKENS).tolist()
    for divisor in (1, 2):  # ZeRO 0-2 at SP 2 on 2 ranks divide by 1; ZeRO-3's reduce-scatter by 2
        ranks = two_ranks(tmp_path, divisor)
        for value, gradient in ranks.values():
            assert value == pytest.approx(one_process_loss)
            assert gradient == pytest.approx(one_process_gradient)


def test_the_value_is_scaled_as_trainer_scales_every_rank_s_loss(tmp_path):
    """With 2 data-parallel groups Trainer logs the mean over ranks of loss / 2: the value carries the factor back,
    so the logged loss is one process's; the gradient stays the shard's own."""
    one_process_loss = sum((x * torch.tensor([0.5, 0.25])).sum() for x in SHARD_INPUTS).item() / TOKENS
    for value, gradient in two_ranks(tmp_path, divisor=1, data_parallel=2).values():
        assert value == pytest.approx(2 * one_process_loss)
        assert gradient == pytest.approx((sum(SHARD_INPUTS) / TOKENS).tolist())


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
    shards = [
        {"shift_labels": torch.tensor([[-100, 5, 6], [7, -100, -100]])},
        {"shift_labels": torch.tensor([[1, 2, -100]])},
    ]
    assert supervised_tokens_in_shards(shards, torch.device("cpu")).item() == 5


# Rank 0's shard is all prompt, rank 1's holds the 3 trained tokens: alone, rank 0 would divide its loss by zero.
RANK_SHARDS = ([{"shift_labels": torch.tensor([[-100, -100, -100]])}], [{"shift_labels": torch.tensor([[5, 6, 7]])}])


def _tokens_in_shards(rank: int) -> int:
    return supervised_tokens_in_shards(RANK_SHARDS[rank], torch.device("cpu")).item()


def test_every_rank_counts_the_trained_tokens_of_all_ranks(tmp_path):
    assert on_two_ranks(tmp_path, _tokens_in_shards) == {0: 3, 1: 3}


def test_the_flag_becomes_accelerates_deepspeed_sequence_parallelism():
    assert parallelism_config(1, "sdpa") is None
    config = parallelism_config(2, "sdpa")
    assert (config.sp_size, config.sp_backend, config.sp_enabled) == (2, "deepspeed", True)
    assert config.sp_handler.sp_seq_length_is_variable and config.sp_handler.sp_attn_implementation == "sdpa"

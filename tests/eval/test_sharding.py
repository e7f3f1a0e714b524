"""Sharding eval records across ranks: equal batches on every rank, every record once, record order restored."""

from __future__ import annotations

import math

import pytest

from hf_lora_ds.eval.sharding import merge_shards, shard

LENGTHS = [5, 9, 9, 2, 7, 7, 7, 1, 4, 8, 3]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 11, 16])
def test_every_record_once_and_equal_sizes(world_size):
    shards = [shard(LENGTHS, rank, world_size) for rank in range(world_size)]
    size = math.ceil(len(LENGTHS) / world_size)
    assert all(len(s.indices) == size for s in shards), "unequal shards would deadlock ZeRO-3 generation"
    real = [i for s in shards for i in s.indices[: s.num_real]]
    assert sorted(real) == list(range(len(LENGTHS)))
    for s in shards:  # duplicates repeat the rank's own prompts (or any prompt when it has none)
        assert set(s.indices[s.num_real :]) <= set(s.indices[: s.num_real] or range(len(LENGTHS)))


def test_single_process_is_longest_first_with_ties_in_input_order():
    s = shard(LENGTHS, 0, 1)
    assert s.indices == [1, 2, 9, 4, 5, 6, 0, 8, 10, 3, 7] and s.num_real == len(LENGTHS)


def test_ranks_get_similar_lengths():
    first, second = (shard(LENGTHS, rank, 2) for rank in range(2))
    assert [LENGTHS[i] for i in first.indices] == [9, 8, 7, 5, 3, 1]
    assert [LENGTHS[i] for i in second.indices] == [9, 7, 7, 4, 2, 2]  # last one is a duplicate
    assert second.num_real == 5


def test_merge_restores_record_order_and_checks_coverage():
    shards = [shard(LENGTHS, rank, 3) for rank in range(3)]
    parts = [[(i, f"p{i}") for i in s.indices[: s.num_real]] for s in shards]
    assert merge_shards(parts, len(LENGTHS)) == [f"p{i}" for i in range(len(LENGTHS))]
    with pytest.raises(RuntimeError, match="two ranks"):
        merge_shards(parts + [[(0, "again")]], len(LENGTHS))
    with pytest.raises(RuntimeError, match="evaluated by no rank"):
        merge_shards(parts[:2], len(LENGTHS))


def test_bad_arguments():
    with pytest.raises(ValueError, match="empty"):
        shard([], 0, 1)
    with pytest.raises(ValueError, match="outside"):
        shard(LENGTHS, 2, 2)

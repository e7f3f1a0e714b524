import types

import torch

from hf_lora_ds import devices
from hf_lora_ds.config.arguments import pinned_memory_helps
from hf_lora_ds.launch import world


def _fake_api(raises: bool = False) -> types.SimpleNamespace:
    def memory_allocated():
        if raises:
            raise RuntimeError("no allocator statistics")
        return 0

    return types.SimpleNamespace(
        is_available=lambda: True, max_memory_allocated=lambda: 0, memory_allocated=memory_allocated
    )


def test_the_accelerator_answers_memory_questions(monkeypatch):
    fake = _fake_api()
    monkeypatch.setattr(torch, "accelerator", fake)
    assert devices.device_memory_api() is fake


def test_a_cuda_build_without_a_gpu_has_no_accelerator(accelerator_seen, monkeypatch):
    """PyPI's Linux torch is a CUDA build: its ``current_accelerator()`` says cuda on a machine without a GPU (torch
    2.11 seen), where pinned batches, nccl or an FSDP offload to a device would follow."""
    accelerator_seen(torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert devices.available_accelerator() is None
    assert not world.has_distributed_accelerator() and not pinned_memory_helps(use_cpu=False)
    accelerator_seen(torch.device("cuda"))
    assert devices.available_accelerator() == torch.device("cuda") and world.has_distributed_accelerator()


def test_none_without_accelerator_or_statistics(monkeypatch):
    monkeypatch.setattr(torch, "accelerator", types.SimpleNamespace(is_available=lambda: False))
    assert devices.device_memory_api() is None
    monkeypatch.setattr(torch, "accelerator", _fake_api(raises=True))
    assert devices.device_memory_api() is None

"""hf_lora_ds.cli.doctor_kernels: the doctor names a default run's kernels in the kernels line's words (the CPU run's,
tests/callbacks/test_kernels_line.py), and the faster options that do not work on a CPU machine as such."""

from __future__ import annotations

import pytest
import torch

from hf_lora_ds.cli.doctor_kernels import default_kernels
from tests.callbacks.test_kernels_line import CPU_DEFAULT


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU machine's findings")
def test_a_cpu_machine_s_default_run_and_options():
    (status, default), (_, options) = default_kernels()
    assert (status, default) == ("ok", f"a default run: {CPU_DEFAULT.removeprefix('kernels: ')}")
    assert "--attn_implementation flash_attention_2 no" in options and "--use_liger_kernel no" in options
    assert "--attn_implementation varlen_attn no" in options and "--torch_compile yes" in options

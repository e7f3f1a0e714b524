#!/usr/bin/env python
"""LoRA supervised fine-tuning of a chat model, then answer accuracy before and after: the job's flow, top to bottom,
is hf_lora_ds/cli/run.py (installed as ``hf-lora-sft`` and ``python -m hf_lora_ds.run_sft``).

    python run_sft.py                                   # the bundled demo: tiny model, sum-to-x data
    python run_sft.py config.yaml                       # every argument from one YAML/JSON file
    torchrun --nproc_per_node 2 run_sft.py ...

Imported (``import run_sft``), its names are hf_lora_ds.cli.run's.
"""

if __name__ == "__main__":
    from hf_lora_ds.command_process import run_command

    run_command("hf_lora_ds.cli.run")
else:
    from hf_lora_ds.cli.run import cli, main, parse_args

    __all__ = ["cli", "main", "parse_args"]

"""``python -m hf_lora_ds.plan``: the memory plan command, hf_lora_ds.cli.plan."""

from hf_lora_ds.command_process import run_command

run_command("hf_lora_ds.cli.plan")

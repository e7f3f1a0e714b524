"""``python -m hf_lora_ds.plan``: the memory plan command, hf_lora_ds.cli.plan."""

from hf_lora_ds.cli.plan import main
from hf_lora_ds.errors import run_cli

run_cli(main)

"""LoRA supervised fine-tuning of a chat model, then answer accuracy before and after.

    python run_sft.py                                   # the bundled demo: tiny model, sum-to-x data
    python run_sft.py config.yaml                       # every argument from one YAML/JSON file
    python run_sft.py --model_name_or_path DIR --train_file FILE --eval_file FILE --eval_task exact_match
    torchrun --nproc_per_node 2 run_sft.py ...          # or deepspeed / accelerate launch (README.md)
    python run_sft.py --save_strategy steps --save_steps 50 --resume_from_checkpoint auto   # resumes after a crash

Also ``hf-lora-sft`` and ``python -m hf_lora_ds.run_sft``. Every argument defaults to the bundled demo. SIGTERM or
SIGUSR1 saves a complete checkpoint after the current step and exits with code 75 (rerun with
``--resume_from_checkpoint auto``); a user error exits with code 2 and one ``error:`` line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import transformers  # the module only: its trainer names import PEFT, which a command imports first, its own way

from hf_lora_ds import LoraSFTTrainer, SFTTrainingArguments
from hf_lora_ds.callbacks.progress_bar import bar_after_setup_lines
from hf_lora_ds.cli.log import configure_logging
from hf_lora_ds.distributed import release_process_group
from hf_lora_ds.errors import run_cli
from hf_lora_ds.launch.resolve import parse_run_arguments
from hf_lora_ds.resources import DEMO_ARGUMENTS
from hf_lora_ds.training.preemption import PREEMPTED_EXIT_CODE

__all__ = ["cli", "main", "parse_args"]


def parse_args(argv: list[str]) -> SFTTrainingArguments:
    """Flags, or a YAML/JSON file then flags that override it (a recipe with the ZeRO stage chosen at launch:
    ``run_sft.py examples/x.yaml --deepspeed stage3``); what is set nowhere is the demo's (``DEMO_ARGUMENTS``)."""
    return parse_run_arguments(argv, DEMO_ARGUMENTS)


def main(argv: list[str] | None = None, callbacks: Sequence[transformers.TrainerCallback] = ()) -> dict:
    """The whole job; ``callbacks`` are extra TrainerCallbacks for programmatic use (a notebook, a test)."""
    configure_logging()  # rank 0's lines on stdout, from argument resolution's on (--deepspeed auto's pick)
    # Arguments before the model: with --deepspeed ZeRO-3 they make from_pretrained partition the weights at load.
    args = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(args)  # --log_level, --log_level_replica
    # The trainer reads --train_file/--eval_file and every record before it loads the model (LoraSFTTrainer).
    trainer = LoraSFTTrainer(args.model_name_or_path, args, callbacks=list(callbacks))
    bar_after_setup_lines(trainer)  # the terminal's bar below the setup lines train() prints, not on their line
    trainer.train()
    if trainer.preempted:  # a complete checkpoint is saved; --resume_from_checkpoint auto continues
        release_process_group()
        raise SystemExit(PREEMPTED_EXIT_CODE)
    trainer.save_state()  # trainer_state.json in output_dir: the step count and the whole log history
    results = trainer.evaluate_answers()  # accuracy before and after, through the live engine
    release_process_group()
    return {phase: result.summary() for phase, result in results.items()}


def cli() -> None:
    """The installed command ``hf-lora-sft``."""
    run_cli(main)  # a UserError is one line on stderr and exit code 2 (hf_lora_ds.errors)

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
from pathlib import Path

import transformers  # the module only: its trainer names import PEFT, which a command imports first, its own way

from hf_lora_ds import LoraSFTTrainer, SFTTrainingArguments
from hf_lora_ds.callbacks import (
    AnswerAccuracyCallback,
    MemoryTraceCallback,
    log_accuracy_end_points,
    write_run_report,
)
from hf_lora_ds.callbacks.preemption import PREEMPTED_EXIT_CODE
from hf_lora_ds.config.deepspeed import run_deepspeed_config
from hf_lora_ds.data.inference_prompts import check_round_trip
from hf_lora_ds.data.run_data import load_run_data, sft_dataset
from hf_lora_ds.distributed import print0, release_process_group
from hf_lora_ds.errors import run_cli
from hf_lora_ds.eval import (
    evaluate_phase,
    get_task,
    load_samples,
    print_comparison,
    run_eval_options,
    write_eval_report,
)
from hf_lora_ds.launch.resolve import parse_run_arguments
from hf_lora_ds.launch.world import describe_world
from hf_lora_ds.model.loading import load_base_model, load_tokenizer
from hf_lora_ds.plan import check_run_fits, profile_from_dataset
from hf_lora_ds.resources import DEMO_ARGUMENTS
from hf_lora_ds.training.checkpoints import resolve_resume_checkpoint


def parse_args(argv: list[str]) -> SFTTrainingArguments:
    """Flags, or a YAML/JSON file then flags that override it (a recipe with the ZeRO stage chosen at launch:
    ``run_sft.py examples/x.yaml --deepspeed stage3``); what is set nowhere is the demo's (``DEMO_ARGUMENTS``)."""
    return parse_run_arguments(argv, DEMO_ARGUMENTS)


def main(argv: list[str] | None = None, callbacks: Sequence[transformers.TrainerCallback] = ()) -> dict:
    """The whole job; ``callbacks`` are extra TrainerCallbacks for programmatic use (a notebook, a test)."""
    # Arguments before the model: with --deepspeed ZeRO-3 they make from_pretrained partition the weights at load.
    args = parse_args(sys.argv[1:] if argv is None else argv)
    transformers.set_seed(args.seed)  # before LoRA wrapping: Trainer seeds only after; the adapter's A init must repeat
    # "auto" picks the latest checkpoint every rank finished; a ZeRO one from another rank count that this run cannot
    # convert to a universal checkpoint fails here, not after the model is loaded.
    resume = resolve_resume_checkpoint(
        args.resume_from_checkpoint, args.output_dir, args.world_size, run_deepspeed_config(args)
    )
    print0(describe_world(args), *([resume.note] if resume.note else []))

    # Data first: every record is validated (file, line, field) before a model is loaded or a step is taken.
    tokenizer = load_tokenizer(args)
    train_data = load_run_data(args.train_file, args, args.dataset)
    train_dataset = sft_dataset(train_data, tokenizer, args)
    print0(train_data.summary() + train_dataset.unused_note())
    print0(check_round_trip(train_dataset).line())  # inference prompts start the training texts, on a sample
    check_run_fits(args, profile_from_dataset(train_dataset))
    task = get_task(args.eval_task)
    eval_data = load_run_data(args.eval_file, args) if args.eval_file else None
    eval_records = list(eval_data.records) if eval_data else None  # generated from, so held whole: keep it small
    if eval_records:
        load_samples(eval_records, task, args.system_prompt)
    # With --eval_strategy, Trainer's evaluations report the loss on the eval set and the callback below its accuracy.
    evaluating_during_training = eval_records is not None and args.eval_strategy != "no"

    memory = MemoryTraceCallback()  # measures the load now; the trainer attaches it with the run's other callbacks
    with memory.phase("load"):
        model, quantized = load_base_model(args)
    if quantized:
        print0(quantized)
    accuracy = (
        [
            AnswerAccuracyCallback(
                tokenizer, eval_records, task, predictions_dir=args.output_dir, **run_eval_options(args)
            )
        ]
        if evaluating_during_training
        else []
    )
    eval_dataset = sft_dataset(eval_data, tokenizer, args) if evaluating_during_training else None
    trainer = LoraSFTTrainer(
        model,
        args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,  # packed, and batched, as --batching says (hf_lora_ds.training.batches)
        processing_class=tokenizer,
        callbacks=[*callbacks, memory, *accuracy],  # placed in the run's order (hf_lora_ds.callbacks.run_callbacks)
    )

    trainer.train(resume_from_checkpoint=resume)  # resolved once, above
    if trainer.preemption.preempted:  # a complete checkpoint is saved; --resume_from_checkpoint auto continues
        release_process_group()
        raise SystemExit(PREEMPTED_EXIT_CODE)
    trainer.save_state()  # trainer_state.json in output_dir: the step count and the whole log history

    results = {}
    if eval_records:
        # Both evals run after training, through the live DeepSpeed engine, which gathers ZeRO-3's weights for them.
        # "before" is the same model as the base it started from (the adapter off, or back at its start where PiSSA-like
        # inits rewrote the base): the base, even for a resumed run.
        with trainer.base_model_view():
            results["before"] = evaluate_phase(trainer.model_wrapped, tokenizer, eval_records, task, args, "before")
        results["after"] = evaluate_phase(trainer.model_wrapped, tokenizer, eval_records, task, args, "after")
        report_path = write_eval_report(results, Path(args.output_dir, "eval_report.json"))
        log_accuracy_end_points(trainer, results["before"].accuracy, results["after"].accuracy)
        write_run_report(trainer, report_path)
        print_comparison(results)
    release_process_group()
    return {phase: result.summary() for phase, result in results.items()}


def cli() -> None:
    """The installed command ``hf-lora-sft``."""
    run_cli(main)  # a UserError is one line on stderr and exit code 2 (hf_lora_ds.errors)

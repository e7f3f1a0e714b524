"""run_sft.py's ``main`` exactly as users launch it, plus test-only callbacks; the e2e tests launch this file.

    deepspeed --num_gpus 2 tests/e2e/sft_entry.py [--kill_rank R --kill_step N --kill_on step_end|save]
        [--sigterm_step N] [--nan_grad_rank R --nan_grad_step N]
        [--record_engine_state] [--offset_loaded_weights R] [--disk_fault full|read_only --disk_fault_step N]
        [--record_logits] [--record_head_outputs] [--record_phase_logits] [--variant NAME:ARGS ...]
        RUN_SFT_ARGS

- ``offset_loaded_weights`` (``--offset_loaded_weights R``): rank R adds 1 to every base weight it loaded, before
  LoRA and any engine. With FSDP's CPU-RAM-efficient loading rank 0's weights are broadcast over every other
  rank's, and the run is the same as without the offset; without it rank R's shards come from its own copy.
- ``SampleRecorder``: when training ends, each rank writes the samples its own (sharded) training dataloader yields
  to ``OUTPUT_DIR/e2e_samples_rank{R}.json``. run_sft.py shows the world size and the global batch, not which rank
  got which sample; this is the one observation it lacks. The loader is read after training, so it cannot change
  the run: each epoch's order comes from the seed and the epoch number alone.
- ``StepRecorder``: each rank rewrites ``OUTPUT_DIR/e2e_steps_rank{R}.json`` when training begins (the global step
  it starts from: 0, or the checkpoint's step after a resume) and adds every optimizer step it then completes, so a
  test can tell a resumed launch (steps 3, 4, ...) from one that trained again from scratch (steps 1, 2, ...).
- ``KillRank``: SIGKILLs rank R at step N, at the end of the step (before any checkpoint of that step) or inside
  the save (after Trainer wrote ``checkpoint-N``, before run_sft's completion marker, whose callback comes later).
  It first writes ``OUTPUT_DIR/e2e_killed.json`` with the wall-clock time of the kill.
- ``DiskFault`` (``--disk_fault full|read_only --disk_fault_step N``): as step N begins, rank 0 fills the file
  system of ``--output_dir`` (a file ``filler`` beside it) or remounts it read-only, so the next save fails there.
- ``SigtermAtStep``: every rank sends itself SIGTERM as step N begins, as a scheduler preempting the job does.
- ``NaNGradient`` (``--nan_grad_rank R --nan_grad_step N``): during step N only, rank R's gradient of its first
  lora_B weight becomes NaN in the backward pass (the loss stays finite), as an overflow on one GPU would.
- ``EngineStateRecorder`` (``--record_engine_state``, DeepSpeed runs): the full fp32 LoRA weights and Adam moments
  the ZeRO optimizer holds, gathered from every rank's partition by DeepSpeed's ``safe_get_full_*`` helpers, written
  by rank 0 to ``OUTPUT_DIR/e2e_engine_state_{save|resumed}_step{N}.pt`` after each save and when a resumed run
  begins (after the checkpoint is loaded, before its first step).
- ``LogitsRecorder`` (``--record_logits``): when training ends, the live trained model's logits on fixed token ids
  (every rank runs the forward: a collective under ZeRO-3), written by rank 0 to ``OUTPUT_DIR/e2e_logits.pt`` with
  the ids and the learning rates of the optimizer's parameter groups, so a test can load the saved adapter on the
  original base and compare, and see LoRA+'s groups as the engine holds them.
- ``HeadOutputRecorder`` (``--record_head_outputs``): the dimensions of what the LM head returned in training and in
  evaluation (0: the fused head's loss, 2: supervised-position logits, 3: every position's), so a test sees which
  loss path ran. ``PhaseLogitsRecorder`` (``--record_phase_logits``): the logits of the model each eval phase
  ("before", "after") evaluates, to ``OUTPUT_DIR/e2e_logits_<phase>.pt``.
- ``--variant NAME:ARGS`` (repeatable): one launch trains several runs one after another, each with the common
  flags plus ARGS and ``--output_dir OUTPUT_DIR/NAME``; the process group is released once, after the last. A
  2-rank launch costs more than a 2-step run of a tiny model, so tests of many variants share launches. Rank 0 prints
  ``[e2e] variant NAME`` before each run, so a test can read each run's part of the log. ARGS may hold this file's
  flags too (``--variant preempted:--sigterm_step 2``): they add to the launch's own for that run only.

- ``first_token`` (``--eval_task first_token``): an eval task that generates one token per sample, registered here
  for tests that need an eval set (its loss) but whose claim is not about generation, which under ZeRO-3 gathers the
  weights for every decoding step.

It runs behind run_sft.py's error boundary (``run_cli``), as users' launches do. After ``main`` returns, each
rank writes ``OUTPUT_DIR/e2e_exit_rank{R}.json``: whether its process group is still
alive (it must not be: see ``release_process_group``), and whether torch's compiler was imported.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hf_lora_ds.command_process import command_imports  # noqa: E402

with command_imports():  # as run_sft.py's command imports its modules
    import torch
    from transformers import TrainerCallback

    from hf_lora_ds.cli import run as run_sft
    from hf_lora_ds.errors import run_cli
    from hf_lora_ds.eval.task_registry import register_task
    from hf_lora_ds.trainer import answers, run_inputs
    from tests.e2e.launching import VARIANT_MARKER


@register_task(max_new_tokens=1)
def first_token(output: str, sample) -> bool:
    return sample.reference.startswith(output.strip())


def offset_loaded_weights(rank: int) -> None:
    load = run_inputs.load_base_model

    def load_and_offset(args):
        model, quantized = load(args)
        if args.process_index == rank:
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(1.0)
        return model, quantized

    run_inputs.load_base_model = load_and_offset


class SampleRecorder(TrainerCallback):
    def on_train_end(self, args, state, control, train_dataloader=None, **kwargs):
        samples = []
        for batch in train_dataloader:
            mask = batch.get("attention_mask")
            for row, ids in enumerate(batch["input_ids"]):
                samples.append(ids[mask[row].bool()].tolist() if mask is not None else ids.tolist())
        Path(args.output_dir, f"e2e_samples_rank{args.process_index}.json").write_text(json.dumps(samples))


class StepRecorder(TrainerCallback):
    def _write(self, args, steps: dict) -> None:
        with contextlib.suppress(OSError):  # a file system DiskFault made refuse writes: the run's own saves say so
            Path(args.output_dir, f"e2e_steps_rank{args.process_index}.json").write_text(json.dumps(steps))

    def on_train_begin(self, args, state, control, **kwargs):
        self.steps = {"start": state.global_step, "completed": []}
        self._write(args, self.steps)

    def on_step_end(self, args, state, control, **kwargs):
        self.steps["completed"].append(state.global_step)
        self._write(args, self.steps)


class DiskFault(TrainerCallback):
    """As step N begins (after checkpoint N-1's save and its completion marker), rank 0 makes the file system of
    ``--output_dir`` refuse writes: ``full`` fills it with a file beside the output directory, leaving 64 KiB;
    ``read_only`` remounts it read-only (root, and a mount of its own: the ``small_disk`` fixture's tmpfs)."""

    def __init__(self, step: int, kind: str):
        self.step, self.kind = step, kind

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 != self.step or args.process_index != 0:
            return
        mount_point = Path(args.output_dir).resolve()
        while not os.path.ismount(mount_point):
            mount_point = mount_point.parent
        print(f"[e2e] {self.kind} file system at {mount_point}, step {self.step}", flush=True)
        if self.kind == "read_only":
            subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], check=True)
            return
        stats = os.statvfs(args.output_dir)
        with open(Path(args.output_dir).parent / "filler", "wb") as filler:
            filler.write(b"0" * (stats.f_bavail * stats.f_frsize - 64 * 1024))


class SigtermAtStep(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class KillRank(TrainerCallback):
    def __init__(self, rank: int, step: int, on: str):
        self.rank, self.step, self.on = rank, step, on

    def _maybe_kill(self, args, state, event: str) -> None:
        if event == self.on and state.global_step == self.step and args.process_index == self.rank:
            Path(args.output_dir, "e2e_killed.json").write_text(json.dumps({"time": time.time(), "rank": self.rank}))
            print(f"[e2e] SIGKILL rank {self.rank} at step {self.step} ({event})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def on_step_end(self, args, state, control, **kwargs):
        self._maybe_kill(args, state, "step_end")

    def on_save(self, args, state, control, **kwargs):
        self._maybe_kill(args, state, "save")


class _NaNBackward(torch.autograd.Function):
    """Identity forward; backward turns the gradient into NaN."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


class NaNGradient(TrainerCallback):
    def __init__(self, rank: int, step: int):
        self.rank, self.step, self.handle = rank, step, None

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 == self.step and args.process_index == self.rank:
            name, lora_b = next((name, param) for name, param in model.named_parameters() if "lora_B" in name)
            if hasattr(lora_b, "full_tensor"):
                # FSDP2: the sharded parameter (a DTensor) never sees the gradient of the unsharded one the forward
                # uses, so the NaN goes in through the lora_B module's output gradient instead.
                module = model.get_submodule(name.rsplit(".", 1)[0])
                self.handle = module.register_forward_hook(lambda module, inputs, output: _NaNBackward.apply(output))
            else:
                self.handle = lora_b.register_hook(lambda grad: grad * float("nan"))

    def on_step_end(self, args, state, control, **kwargs):
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


class EngineStateRecorder(TrainerCallback):
    def _record(self, args, state, model, event: str) -> None:
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        tensors = {}
        for name, param in model.named_parameters():
            if param.requires_grad:  # every rank gathers (a collective under ZeRO-3); rank 0 writes
                tensors[name] = {"fp32": safe_get_full_fp32_param(param).clone()}
                for key in ("exp_avg", "exp_avg_sq"):
                    tensors[name][key] = safe_get_full_optimizer_state(param, key).clone()
        if args.process_index == 0:
            torch.save(tensors, Path(args.output_dir, f"e2e_engine_state_{event}_step{state.global_step}.pt"))

    def on_save(self, args, state, control, model=None, **kwargs):
        self._record(args, state, model, "save")

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step > 0:
            self._record(args, state, model, "resumed")


class LogitsRecorder(TrainerCallback):
    IDS = list(range(3, 40))

    def on_train_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        ids = torch.tensor([self.IDS])
        training = model.training
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float().cpu()
        model.train(training)
        if args.process_index == 0:
            rates = sorted({group["lr"] for group in optimizer.param_groups if len(group["params"])})
            torch.save({"input_ids": ids, "logits": logits, "group_lrs": rates}, Path(args.output_dir, "e2e_logits.pt"))


class HeadOutputRecorder(TrainerCallback):
    """What the LM head returned in training and in evaluation, as the number of dimensions of its output: 0 where
    the fused head computed the loss itself, 2 for supervised-position logits, 3 for every position's logits. Written
    to ``OUTPUT_DIR/e2e_head_outputs_rank{R}.json`` when training ends (evaluation during training included)."""

    def __init__(self) -> None:
        self.seen: dict[str, set[int]] = {"train": set(), "eval": set()}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        def record(module, inputs, output):
            self.seen["train" if module.training else "eval"].add(output.dim())

        model.get_output_embeddings().register_forward_hook(record)

    def on_train_end(self, args, state, control, **kwargs):
        seen = {phase: sorted(dims) for phase, dims in self.seen.items()}
        Path(args.output_dir, f"e2e_head_outputs_rank{args.process_index}.json").write_text(json.dumps(seen))


class PhaseLogitsRecorder:
    """``run_sft``'s ``evaluate_phase`` with the logits of the model each phase evaluates (on ``LogitsRecorder.IDS``)
    recorded first, to ``OUTPUT_DIR/e2e_logits_<phase>.pt``: "before" must be the base the run started from. Every
    rank runs the forward (a collective under ZeRO-3); rank 0 writes."""

    def __init__(self, evaluate_phase) -> None:
        self.evaluate_phase = evaluate_phase

    def __call__(self, model, tokenizer, records, task, args, phase):
        training = model.training
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([LogitsRecorder.IDS])).logits.float().cpu()
        model.train(training)
        if args.process_index == 0:
            torch.save(logits, Path(args.output_dir, f"e2e_logits_{phase}.pt"))
        return self.evaluate_phase(model, tokenizer, records, task, args, phase)


def run_variants(run_sft_args: list[str], variants: list[str], parser: argparse.ArgumentParser, ours) -> None:
    """Each variant's run in turn in this process, the process group kept between them and released by the last run
    as ``main`` releases it (also when that run is preempted). A variant's ARGS may hold this file's own flags."""
    output_dir = Path(run_sft_args[run_sft_args.index("--output_dir") + 1])
    release = run_sft.release_process_group
    run_sft.release_process_group = lambda: None
    try:
        environment = dict(os.environ)
        for index, (name, extra) in enumerate(variant.split(":", 1) for variant in variants):
            if os.environ.get("RANK", "0") == "0":
                print(f"{VARIANT_MARKER}{name}", flush=True)
            if index == len(variants) - 1:
                run_sft.release_process_group = release
            own, extra_args = parser.parse_known_args(extra.split(), namespace=copy.copy(ours))
            run_args = [*run_sft_args, *extra_args, "--output_dir", str(output_dir / name)]
            run_once(run_args, own)
            # Accelerate exports its DeepSpeed settings (ACCELERATE_*) for the run it built; the next run would take
            # them for an ``accelerate launch`` config.
            os.environ.clear()
            os.environ.update(environment)
    finally:
        run_sft.release_process_group = release


def run_once(run_args: list[str], ours: argparse.Namespace) -> None:
    """run_sft's ``main`` with the test callbacks, and each eval phase's logits recorded where asked."""
    evaluate_phase = answers.evaluate_phase
    if ours.record_phase_logits:
        answers.evaluate_phase = PhaseLogitsRecorder(evaluate_phase)
    try:
        run_sft.main(run_args, callbacks=test_callbacks(ours))
    finally:
        answers.evaluate_phase = evaluate_phase


def test_callbacks(ours: argparse.Namespace) -> list[TrainerCallback]:
    """The test-only callbacks this file's flags ask for, beside the recorders every run has."""
    callbacks = [SampleRecorder(), StepRecorder()]
    if ours.kill_rank is not None:
        callbacks.append(KillRank(ours.kill_rank, ours.kill_step, ours.kill_on))
    if ours.sigterm_step is not None:
        callbacks.append(SigtermAtStep(ours.sigterm_step))
    if ours.nan_grad_rank is not None:
        callbacks.append(NaNGradient(ours.nan_grad_rank, ours.nan_grad_step))
    if ours.record_engine_state:
        callbacks.append(EngineStateRecorder())
    if ours.disk_fault is not None:
        callbacks.append(DiskFault(ours.disk_fault_step, ours.disk_fault))
    if ours.record_logits:
        callbacks.append(LogitsRecorder())
    if ours.record_head_outputs:
        callbacks.append(HeadOutputRecorder())
    return callbacks


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--kill_rank", type=int, default=None)
    parser.add_argument("--kill_step", type=int, default=None)
    parser.add_argument("--kill_on", choices=("step_end", "save"), default="step_end")
    parser.add_argument("--sigterm_step", type=int, default=None)
    parser.add_argument("--record_engine_state", action="store_true")
    parser.add_argument("--nan_grad_rank", type=int, default=None)
    parser.add_argument("--nan_grad_step", type=int, default=None)
    parser.add_argument("--offset_loaded_weights", type=int, default=None)
    parser.add_argument("--disk_fault", choices=("full", "read_only"), default=None)
    parser.add_argument("--disk_fault_step", type=int, default=None)
    parser.add_argument("--record_logits", action="store_true")
    parser.add_argument("--record_head_outputs", action="store_true")
    parser.add_argument("--record_phase_logits", action="store_true")
    parser.add_argument("--variant", action="append", metavar="NAME:ARGS", default=[])
    ours, run_sft_args = parser.parse_known_args()
    if ours.offset_loaded_weights is not None:
        offset_loaded_weights(ours.offset_loaded_weights)

    def run_and_record_exit() -> None:
        if ours.variant:
            run_variants(run_sft_args, ours.variant, parser, ours)
        else:
            run_once(run_sft_args, ours)
        # A gloo group still alive at exit can abort the process in interpreter teardown: main must have released it.
        output_dir = Path(run_sft_args[run_sft_args.index("--output_dir") + 1])
        left = {
            "process_group_alive": torch.distributed.is_initialized(),
            "compiler_imported": "functorch.compile" in sys.modules,  # what torch.compile imports (hf_lora_ds._compat)
        }
        Path(output_dir, f"e2e_exit_rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(left))

    run_cli(run_and_record_exit)  # behind run_sft.py's own error boundary: a user error is one line, exit code 2


if __name__ == "__main__":
    main()

"""Make Trainer's world size, its data sharding and DeepSpeed's world size agree, on CPU and on accelerators.

``prepare_distributed(values)`` runs before ``SFTTrainingArguments`` is built (its ``__post_init__`` builds
accelerate's process state) and ``ensure_world_agreement(args)`` after it, both in
``hf_lora_ds.launch.resolve.parse_run_arguments``; a script that builds the arguments itself calls them the same way.
Each fix below says which library gap it closes; on a GPU machine, or for one process without DeepSpeed, none acts.
"""

from __future__ import annotations

import contextlib
import os
import socket

import torch
from transformers import TrainingArguments

from hf_lora_ds._compat import deepspeed_startup_trimmed
from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.devices import available_accelerator
from hf_lora_ds.distributed import WORLD_SIZE_VARIABLES, launcher_world_size, process_group_exists

__all__ = [
    "prepare_distributed",
    "has_distributed_accelerator",
    "resolve_use_cpu",
    "name_local_world_size",
    "emulate_single_process_launcher",
    "share_process_group_with_deepspeed",
    "check_world_size",
    "ensure_world_agreement",
    "unlink_deepspeed_shm_buffers",
]


def prepare_distributed(args: SFTTrainingArguments) -> None:
    """Call *before* the ``TrainingArguments`` are built (their ``__post_init__`` builds the process state), on the
    ``unbuilt`` arguments; pair it with ``ensure_world_agreement(args)`` right after. ``use_cpu`` is resolved here, once
    (``resolve_use_cpu``). No-op for a single process on a GPU or without DeepSpeed, and for any launch on a GPU
    machine."""
    name_local_world_size()
    args.use_cpu = resolve_use_cpu(args.use_cpu)
    if args.deepspeed:
        emulate_single_process_launcher()


def has_distributed_accelerator() -> bool:
    """Whether this process has a device that accelerate would pick a distributed backend for.

    MPS counts as none: accelerate has no multi-process MPS backend, so a multi-rank launch there must run on CPU.
    """
    accelerator = available_accelerator()
    return accelerator is not None and accelerator.type != "mps"


def resolve_use_cpu(use_cpu: bool) -> bool:
    """The ``use_cpu`` value TrainingArguments needs so every rank sees the true world size.

    Call it in ``TrainingArguments.__post_init__`` *before* ``super().__post_init__()``, which builds the process
    state. True when the user asked for CPU, or when several processes were launched and there is no accelerator.
    A single process, or any run with a GPU, keeps the user's value: a no-op there.

    Why: with several ranks and no accelerator, accelerate (1.15, ``PartialState._prepare_backend``) finds no backend
    and reads that as "not distributed" (world size 1 on every rank); only ``cpu=True``, which TrainingArguments passes
    for ``use_cpu``, takes its gloo ``MULTI_CPU`` path. ``ACCELERATE_USE_CPU`` would not do: it keeps DeepSpeed off.
    """
    return use_cpu or (launcher_world_size() > 1 and not has_distributed_accelerator())


def name_local_world_size() -> None:
    """Export the DeepSpeed launcher's ``LOCAL_SIZE`` as ``LOCAL_WORLD_SIZE``, the name torchrun and accelerate use.

    On the CPU path accelerate gives each rank ``physical cores / LOCAL_WORLD_SIZE`` threads; missing, it assumes
    one rank per machine, so N ranks each run all cores' worth of OpenMP threads. Measured here (2 cores, 2 ranks,
    ZeRO-3, 4 steps): train_runtime 11.0-11.9 s without the variable, 0.93 s with one thread per rank.
    """
    if os.environ.get("LOCAL_SIZE") and not os.environ.get("LOCAL_WORLD_SIZE"):
        os.environ["LOCAL_WORLD_SIZE"] = os.environ["LOCAL_SIZE"]


def emulate_single_process_launcher() -> None:
    """Give a plain ``python run_sft.py --deepspeed ...`` the environment a one-process launcher would set.

    Without RANK/WORLD_SIZE/MASTER_* DeepSpeed's ``init_distributed`` falls back to MPI discovery and fails with
    ``No module named 'mpi4py'`` (on GPU machines too). The variables make it a world of one over TCP on loopback,
    exactly like ``deepspeed --num_gpus 1``; transformers' docs prescribe the same for notebooks. Any launcher
    (torchrun, deepspeed, accelerate, mpirun) already sets them, and then nothing is touched.
    """
    if any(os.environ.get(name) for name in (*WORLD_SIZE_VARIABLES, "RANK", "LOCAL_RANK")):
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def share_process_group_with_deepspeed(args: TrainingArguments) -> None:
    """Register the process group accelerate created with ``deepspeed.comm`` before any ZeRO-3 model is built.

    Under ZeRO-3, ``from_pretrained`` enters ``deepspeed.zero.Init``, whose ``DeepSpeedConfig`` asks
    ``deepspeed.comm`` for the world size and silently falls back to 1 when deepspeed.comm was never initialised;
    the batch assertion then fails (``4 != 2 * 1 * 1``). accelerate initialises deepspeed.comm itself only on its
    accelerator path; on the ``use_cpu`` path it creates a plain torch.distributed group. Wrapping that same group
    is what ``deepspeed.initialize`` would do later anyway (or, in a world of one, ``zero.Init`` as the model loads),
    so doing it now changes nothing else, made as the run makes it (``deepspeed_startup_trimmed``: no CPU
    shared-memory allreduce).
    """
    if not args.deepspeed or not process_group_exists():
        return
    import deepspeed.comm

    if not deepspeed.comm.is_initialized():
        with deepspeed_startup_trimmed():
            deepspeed.comm.init_distributed(
                dist_backend=torch.distributed.get_backend(), auto_mpi_discovery=False, timeout=args.ddp_timeout_delta
            )


def check_world_size(args: TrainingArguments) -> None:
    """Fail fast, with the fix in the message, when Trainer's world size is not the launcher's.

    DeepSpeed would otherwise fail later with an opaque batch-size assertion, and DDP-less runs would silently
    train every rank on the full data.
    """
    launched = launcher_world_size()
    dist_size = torch.distributed.get_world_size() if process_group_exists() else 1
    if args.world_size != launched or (process_group_exists() and dist_size != launched):
        raise RuntimeError(
            f"World size disagreement: the launcher started {launched} processes, torch.distributed has "
            f"{dist_size}, TrainingArguments sees {args.world_size}. Set use_cpu before TrainingArguments is "
            "built (hf_lora_ds.launch.world.resolve_use_cpu) when no GPU is present, and do not create an "
            "accelerate PartialState before TrainingArguments."
        )


def ensure_world_agreement(args: TrainingArguments) -> None:
    """Call right after TrainingArguments is built (end of ``__post_init__``) and before the model is loaded."""
    share_process_group_with_deepspeed(args)
    check_world_size(args)
    unlink_deepspeed_shm_buffers()


def unlink_deepspeed_shm_buffers(shm_dir: str = "/dev/shm") -> None:
    """Remove the names of DeepSpeed's CPU shared-memory allreduce buffers once every rank has mapped them.

    DeepSpeed's CPU communication (``shm_comm``, used when all ranks are on one host) gives each rank a ~69 MB
    ``shm_open`` buffer named ``deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>`` and never unlinks it, so
    every CPU launch leaves them in ``/dev/shm``, which is RAM: on this project's machine they piled up to 21 GB and
    got the compiler OOM-killed. Each rank maps every other rank's buffer before its communication init returns, so
    after a barrier the names can go: the mappings stay valid until the processes exit, and then the memory is freed.
    The run's own initialisation makes none (``deepspeed_startup_trimmed``); a script's may have, before the run.
    """
    if not process_group_exists():
        return
    prefix = f"deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR')}_{os.environ.get('MASTER_PORT')}"
    own = os.path.join(shm_dir, f"{prefix}_{torch.distributed.get_rank()}")
    # Mapped by this very process, not left by an older job on the same port. Every rank has the same answer:
    # DeepSpeed creates the buffers on all ranks of a one-host job, or on none.
    if not _mapped_by_this_process(own):
        return
    torch.distributed.barrier()  # every rank is past its shm init, so every buffer is mapped everywhere
    with contextlib.suppress(FileNotFoundError):
        os.unlink(own)


def _mapped_by_this_process(path: str) -> bool:
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            return any(line.rstrip("\n").endswith(" " + path) for line in maps)
    except OSError:  # not Linux: no /dev/shm either
        return False

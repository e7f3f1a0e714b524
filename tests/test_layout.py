"""The folders show the architecture, and the code keeps to it: imports only go down the layers below, every
TrainerCallback lives in callbacks/, the top level stays small, and every module has its test module at the same path
under tests/ (hf_lora_ds/data/dataset.py -> tests/data/test_dataset.py, a package's __main__.py -> test_main.py; a
command's ``python -m`` shim, which defines nothing, needs none).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
from transformers import TrainerCallback

from tests.test_imports import MODULES, PACKAGE, imported_modules

TESTS = Path(__file__).resolve().parent

# Bottom to top, one rank per folder: a module imports only from its own folder or from folders of a lower rank; two
# folders of one rank import nothing of each other. A package's ``__main__`` is an entry point wherever it stands
# (``python -m hf_lora_ds.eval`` runs the command line, which sits above every folder).
LAYERS: list[dict[str, list[str]]] = [
    {
        "core": [
            "hf_lora_ds._compat",
            "hf_lora_ds._lazy",
            "hf_lora_ds.errors",
            "hf_lora_ds.distributed",
            "hf_lora_ds.devices",
            "hf_lora_ds.resources",
            "hf_lora_ds.sizes",
        ]
    },
    # hf_lora_ds.vision is one concern across layers: the pixel bounds are configuration, images and their tokens and
    # batches are data, the processor and the tower are the model's.
    {"config": ["hf_lora_ds.config", "hf_lora_ds.vision", "hf_lora_ds.vision.resolution"]},
    {
        "data": [
            "hf_lora_ds.data",
            "hf_lora_ds.vision.images",
            "hf_lora_ds.vision.encoding",
            "hf_lora_ds.vision.collator",
            "hf_lora_ds.vision.packing",
            "hf_lora_ds.vision.token_count",
        ],
        "model": ["hf_lora_ds.model", "hf_lora_ds.vision.modules", "hf_lora_ds.vision.processor"],
    },
    {"training runtime": ["hf_lora_ds.training", "hf_lora_ds.vision.every_rank"]},
    {"eval": ["hf_lora_ds.eval"], "report": ["hf_lora_ds.report"], "planner": ["hf_lora_ds.plan"]},
    {"callbacks": ["hf_lora_ds.callbacks"]},
    # The run's resolution, below the trainer that resolves the arguments it is handed (hf_lora_ds.launch.resolve).
    {"launch": ["hf_lora_ds.launch"]},
    {"trainer": ["hf_lora_ds.trainer"]},
    {"command lines": ["hf_lora_ds.cli"]},
    # The public facade, the ``python -m`` shims of the commands and what they do to their process, and the test models
    # (imported by nothing here).
    {
        "entry points": [
            "hf_lora_ds",
            "hf_lora_ds.run_sft",
            "hf_lora_ds.audit",
            "hf_lora_ds.merge",
            "hf_lora_ds.doctor",
            "hf_lora_ds.command_process",
            "hf_lora_ds._testing",
        ]
    },
]
ENTRY_POINTS = len(LAYERS) - 1


def place(module: str) -> tuple[int, str]:
    """The rank and group of ``module``: the layer entry with the longest name that is the module or contains it."""
    matches = [
        (len(prefix), rank, group)
        for rank, groups in enumerate(LAYERS)
        for group, prefixes in groups.items()
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    _, rank, group = max(matches)
    return (ENTRY_POINTS, "entry points") if module.endswith(".__main__") else (rank, group)


def against_the_layers(module: str, imported: set[str]) -> list[str]:
    """The imports of ``module`` that go up the layers or across to another group of its rank."""
    rank, group = place(module)
    return sorted(
        target
        for target in imported
        if place(target)[0] > rank or (place(target)[0] == rank and place(target)[1] != group)
    )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module):
    assert against_the_layers(module, imported_modules(module, type_checking=True)) == []


def test_the_layer_check_sees_an_import_against_the_layers():
    assert against_the_layers("hf_lora_ds.data.dataset", {"hf_lora_ds.training.checkpoints"}) == [
        "hf_lora_ds.training.checkpoints"
    ]
    assert against_the_layers("hf_lora_ds.model.lora", {"hf_lora_ds.data.formats"}) == ["hf_lora_ds.data.formats"]
    assert against_the_layers("hf_lora_ds.config.data", {"hf_lora_ds.launch.resolve", "hf_lora_ds.errors"}) == [
        "hf_lora_ds.launch.resolve"
    ]
    assert against_the_layers("hf_lora_ds.plan.run_plan", {"hf_lora_ds.eval.tasks"}) == ["hf_lora_ds.eval.tasks"]
    assert against_the_layers("hf_lora_ds.trainer.lora_sft_trainer", {"hf_lora_ds.callbacks.memory"}) == []
    assert against_the_layers("hf_lora_ds.training.checkpoints", {"hf_lora_ds.callbacks.memory"}) == [
        "hf_lora_ds.callbacks.memory"
    ]


def test_the_layer_check_reads_type_checking_imports():
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hf_lora_ds.launch.resolve import resolve_run\n"
    )
    imported = imported_modules("hf_lora_ds.model.quantization", source, type_checking=True)
    assert against_the_layers("hf_lora_ds.model.quantization", imported) == [
        "hf_lora_ds.launch",
        "hf_lora_ds.launch.resolve",
    ]


def test_nothing_in_the_package_imports_its_testing_module():
    assert [
        name
        for name in MODULES
        if not name.startswith("hf_lora_ds._testing")
        and {"hf_lora_ds._testing", "hf_lora_ds._testing.tiny_models"} & imported_modules(name)
    ] == []


def test_no_module_is_over_450_lines():
    """Small files: past this size a module holds more than one concern."""
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 450
    }
    assert long == {}, long


def test_the_top_level_holds_at_most_twelve_modules():
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top


def test_every_trainer_callback_is_defined_under_callbacks():
    outside = []
    for name in sorted(MODULES):
        if name.endswith("__main__"):
            continue
        for _, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass):
            if issubclass(cls, TrainerCallback) and cls.__module__ == name:
                outside += [] if name.startswith("hf_lora_ds.callbacks.") else [f"{name}.{cls.__name__}"]
    assert outside == []


def mirrored_test(path: Path) -> Path:
    """tests/<the module's folder>/test_<its name>.py; a package's __main__.py is tested by its test_main.py."""
    relative = path.relative_to(PACKAGE)
    stem = "main" if relative.stem == "__main__" else relative.stem
    return TESTS / relative.parent / f"test_{stem}.py"


def defines_code(path: Path) -> bool:
    """A module with a function or class of its own (a package face that only hands names on has none)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in tree.body)


def test_every_module_has_its_test_module_at_the_same_path():
    missing = [
        str(mirrored_test(path).relative_to(TESTS.parent))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.resolve().is_relative_to(PACKAGE) and defines_code(path) and not mirrored_test(path).is_file()
    ]
    assert missing == []


def _annotations(tree: ast.AST) -> list[ast.expr]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            found += [arg.annotation for arg in every if arg is not None and arg.annotation is not None]
            found += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
    return found


def test_no_argparse_namespace_stands_for_the_run_outside_the_command_lines():
    """The run's configuration is typed (SFTTrainingArguments, built or ``unbuilt``); an argparse Namespace
    is a command line's own business (hf_lora_ds/cli/)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "cli" in path.relative_to(PACKAGE).parts:
            continue
        for annotation in _annotations(ast.parse(path.read_text(encoding="utf-8"))):
            if "Namespace" in ast.unparse(annotation):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{annotation.lineno}")
    assert offenders == [], offenders


# The flags that choose the engine are read (checked, and resolved in place) in config/ and launch/ only; everything
# else reads the decision made from them once, ``args.engine`` (hf_lora_ds.config.engine).
ENGINE_FLAGS = ("deepspeed", "sequence_parallel_size")
ENGINE_FLAG_FOLDERS = ("config", "launch")
# Attributes of the same name on another library's object, not the run's flags: (module, the object read).
NOT_THE_FLAGS = {
    ("hf_lora_ds/callbacks/engine_line.py", "wrapped"): "the DeepSpeed engine's own Ulysses size: what the run got",
}


def engine_flag_uses(source: str) -> list[tuple[int, str]]:
    """``(line, object)`` for each ``obj.deepspeed`` / ``obj.sequence_parallel_size`` read or written, and each
    ``getattr``/``hasattr``/``setattr`` of those names; an attribute of an imported module (``import
    transformers.integrations.deepspeed``) is a module, not a flag, and a keyword or parameter of that name reads
    nothing."""
    tree = ast.parse(source)
    modules = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENGINE_FLAGS:
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if not (isinstance(root, ast.Name) and root.id in modules):
                found.append((node.lineno, ast.unparse(node.value)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in ENGINE_FLAGS
        ):
            found.append((node.lineno, ast.unparse(node.args[0])))
    return found


def test_the_engine_flag_check_sees_reads_writes_and_getattr_but_not_modules_or_keywords():
    source = (
        "import deepspeed\nimport transformers.integrations.deepspeed\n"
        "def f(args, sequence_parallel_size=1):\n"
        "    deepspeed.initialize(sequence_parallel_size=sequence_parallel_size)\n"
        "    transformers.integrations.deepspeed.is_deepspeed_zero3_enabled()\n"
        "    args.deepspeed = 'stage2'\n"
        "    return self.args.sequence_parallel_size, getattr(trainer.args, 'sequence_parallel_size', 1)\n"
    )
    assert engine_flag_uses(source) == [(6, "args"), (7, "self.args"), (7, "trainer.args")]


def test_only_config_and_launch_read_the_engine_flags():
    """``--deepspeed`` and ``--sequence_parallel_size`` are turned once into ``args.engine``; the rest reads that."""
    offenders, seen_elsewhere = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] in ENGINE_FLAG_FOLDERS:
            continue
        module = str(path.relative_to(PACKAGE.parent))
        for line, read in engine_flag_uses(path.read_text(encoding="utf-8")):
            if (module, read) in NOT_THE_FLAGS:
                seen_elsewhere.add((module, read))
            else:
                offenders.append(f"{module}:{line} ({read})")
    assert offenders == [], offenders
    assert seen_elsewhere == set(NOT_THE_FLAGS)  # an exception no longer needed is dropped

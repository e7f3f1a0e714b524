"""The package's import graph has no cycle, counting imports inside functions (the kind that hid one: arguments ->
plan -> lora -> arguments worked only because its first edge was a function-level import), and every module imports
on its own. Which way the imports may go is tests/test_layout.py's."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_lora_ds"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py")) if path.resolve().is_relative_to(PACKAGE)}


def _type_checking_only(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imported_modules(name: str, source: str | None = None, type_checking: bool = False) -> set[str]:
    """The package's modules ``name`` (or ``source`` standing in for its text) imports when it runs, at import time
    or inside a function, each with the subpackage ``__init__`` an import of it runs first; ``if TYPE_CHECKING:``
    blocks do not run, and count only with ``type_checking`` (the layers hold for them too)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8") if source is None else source)
    skipped = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _type_checking_only(node)
        for child in ast.walk(node)
        if not type_checking
    }
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    found = set()
    for target in targets:
        parts = target.split(".")
        # Every subpackage on the way runs its __init__; the top package's is the public facade, imported by all.
        found.update(".".join(parts[:i]) for i in range(2, len(parts) + 1) if ".".join(parts[:i]) in MODULES)
    # A module's own packages ran their __init__ before it did: importing from them runs nothing new.
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    return found - ancestors


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for successor in sorted(graph[node]):
            if state.get(successor) == 1:
                return stack[stack.index(successor) :] + [successor]
            if successor not in state and (cycle := visit(successor)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle():
    graph = {name: imported_modules(name) for name in MODULES}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_checker_sees_a_cycle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    inside_a_function = "def check(self):\n    from hf_lora_ds.plan.run_plan import recommended_deepspeed_config\n"
    assert {"hf_lora_ds.plan", "hf_lora_ds.plan.run_plan"} <= imported_modules("hf_lora_ds.config", inside_a_function)
    relative = (
        "from .table import plan_line\n"
        "if TYPE_CHECKING:\n    from hf_lora_ds.trainer.lora_sft_trainer import LoraSFTTrainer\n"
    )
    assert imported_modules("hf_lora_ds.plan.run_plan", relative) == {"hf_lora_ds.plan.table"}


@pytest.mark.slow
@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_every_module_imports_in_a_fresh_interpreter(order):
    names = [name for name in sorted(MODULES) if not name.endswith("__main__")]
    names = names if order == "sorted" else names[::-1]
    done = subprocess.run(
        [sys.executable, "-c", "import importlib, sys\nfor n in sys.argv[1:]: importlib.import_module(n)", *names],
        capture_output=True,
        text=True,
        cwd=PACKAGE.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]

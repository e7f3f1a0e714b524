"""README.md is the front door and docs/ holds one page per concern. A page that sends its reader to a file or heading
that is not there, names a repository file that is gone, or shows a command whose flags the command no longer takes
fails here. Each command a page shows in a ``bash`` block (or after a ``$`` prompt in another block) that starts one
of this package's commands, under any launcher, runs through that command's own ``main`` up to where its flags are
parsed and no further (no model, no data, the user's files need not exist); the launcher's own flags go through the
launcher's parser. The audit on the bundled demo runs whole, and prints what its page shows under it."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pytest
from transformers import HfArgumentParser

from tests import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, REPO / "README.zh-CN.md", *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 250

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
# A repository path a page names in code: `tests/...`, `hf_lora_ds/...` (not a user's `out/...` or `/tmp/...`).
REPO_PATH = re.compile(
    r"(?<![\w/.~-])((?:hf_lora_ds|tests|bench|examples|scripts|docs|ds_configs|fsdp_configs|accelerate_configs)"
    r"/[\w./*-]*[\w/*])"
)

# python -m hf_lora_ds.<name> (and the installed commands) -> the module whose main() is the command
COMMANDS = {
    "run_sft": "hf_lora_ds.cli.run",
    "audit": "hf_lora_ds.cli.audit",
    "plan": "hf_lora_ds.cli.plan",
    "eval": "hf_lora_ds.cli.eval",
    "merge": "hf_lora_ds.cli.merge",
    "doctor": "hf_lora_ds.cli.doctor",
}
INSTALLED = {"hf-lora-sft": "run_sft", "hf-lora-doctor": "doctor"}
ARGUMENT_FILES = (".yaml", ".yml", ".json")
PLACEHOLDER = "..."  # "the rest of your flags"


def read(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def prose(text: str) -> str:
    """The text outside code blocks: where headings and links are."""
    return FENCE.sub("", text)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lowercase, markup and punctuation dropped, spaces made hyphens, a
    repeated heading numbered (-1, -2, ...)."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?)[ #]*$", prose(read(page)), flags=re.MULTILINE):
        slug = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", slug.lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return found


def links(page: Path) -> list[str]:
    return LINK.findall(INLINE_CODE.sub("", prose(read(page))))


class Shown(NamedTuple):
    page: Path
    command: list[str]
    output: list[str]  # the lines a page shows under a `$ ` command, "..." left out

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}: {shlex.join(self.command)}"


def shown_commands(page: Path) -> list[Shown]:
    """Every command line of the page's bash blocks, and every `$ ` line of its other blocks with the lines under it:
    continued lines joined, comments dropped, chains (&&, ||, ;, |) split into their commands."""
    shown = []
    for language, body in FENCE.findall(read(page)):
        lines = body.replace("\\\n", " ").splitlines()
        for number, line in enumerate(lines):
            if language != "bash":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            output = []
            if language != "bash":
                for below in lines[number + 1 :]:
                    if below.startswith("$ "):
                        break
                    if below.strip() and below.strip() != PLACEHOLDER:
                        output.append(below)
            command: list[str] = []
            for token in [*shlex.split(line, comments=True), "&&"]:
                if token in ("&&", "||", ";", "|"):
                    if command:
                        shown.append(Shown(page, command, output))
                    command = []
                else:
                    command.append(token)
    return shown


def launched(module: bool, script: str, arguments: list[str]) -> tuple[str, list[str]] | None:
    """The command a launcher starts: a script (``run_sft.py``) or, with its module flag, a module."""
    if module:
        return module_command(script, arguments)
    return script_command(script, arguments)


def module_command(module: str, arguments: list[str]) -> tuple[str, list[str]] | None:
    if not module.startswith("hf_lora_ds."):
        return None  # python -m pytest, venv, pip
    name = module.removeprefix("hf_lora_ds.")
    assert name in COMMANDS and importlib.util.find_spec(module), f"python -m {module}: no such command"
    return name, arguments


def script_command(script: str, arguments: list[str]) -> tuple[str, list[str]] | None:
    if Path(script).name == "run_sft.py":
        assert (REPO / script).is_file(), f"{script}: no such file"
        return "run_sft", arguments
    if script.startswith("bench/"):
        return "bench", [script, *arguments]
    return None


def package_command(command: list[str]) -> tuple[str, list[str]] | None:
    """(the command's name, its arguments) when the line starts one of this package's commands, directly or under
    torchrun, deepspeed or accelerate launch (their flags parsed by their own parsers); else None."""
    while command and re.fullmatch(r"[A-Za-z_]\w*=.*", command[0]):  # VARIABLE=value before the command
        command = command[1:]
    head, rest = command[0], [token for token in command[1:] if token != PLACEHOLDER]
    if head in ("python", "python3") and rest:
        return module_command(rest[1], rest[2:]) if rest[0] == "-m" else script_command(rest[0], rest[1:])
    if head in INSTALLED:
        return INSTALLED[head], rest
    if head == "torchrun":
        from torch.distributed.run import get_args_parser

        options = get_args_parser().parse_args(rest)
        return launched(options.module, options.training_script, options.training_script_args)
    if head == "deepspeed":
        from deepspeed.launcher.runner import parse_args

        options = parse_args(rest)
        return launched(options.module, options.user_script, options.user_args)
    if head == "accelerate" and rest[:1] == ["launch"]:
        from accelerate.commands.launch import launch_command_parser

        options = launch_command_parser().parse_args(rest[1:])
        return launched(options.module, options.training_script, options.training_script_args)
    return None


# What starts one of this package's commands, the launcher's flags aside (package_command reads them).
OURS_PATTERN = re.compile(
    r"(\w+=\S* )*(python3? (-m hf_lora_ds\.|\S*run_sft\.py|bench/)|hf-lora-|torchrun |deepspeed |accelerate launch )"
)
OURS = [shown for page in PAGES for shown in shown_commands(page) if OURS_PATTERN.match(shlex.join(shown.command))]


class Parsed(Exception):
    """The command's flags are parsed; nothing after that in its main() runs. ``unknown``: what a parse that keeps
    the rest (``parse_known_args``) did not take."""

    def __init__(self, unknown: list[str]) -> None:
        super().__init__(unknown)
        self.unknown = unknown


def stop_after_parsing(monkeypatch: pytest.MonkeyPatch, known_args_of: type) -> None:
    """Every ``parse_args`` stops the command once argparse has parsed (its own errors included), and so does
    ``parse_known_args`` of ``known_args_of`` (HfArgumentParser: run_sft's flags, which the audit reaches after a
    parse_known_args of its own flags; any parser for a bench script)."""
    parse_known_args = argparse.ArgumentParser.parse_known_args

    def parse_args(self, args=None, namespace=None):
        _, unknown = parse_known_args(self, args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")  # as argparse's own parse_args says it
        raise Parsed([])

    def known_args(self, args=None, namespace=None):
        raise Parsed(parse_known_args(self, args, namespace)[1])

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    monkeypatch.setattr(known_args_of, "parse_known_args", known_args)


def bench_main(script: str, arguments: list[str], monkeypatch: pytest.MonkeyPatch):
    """A bench script's main, reading ``arguments`` as its command line."""
    path = REPO / script
    assert path.is_file(), f"{script}: no such file"
    monkeypatch.setattr(sys, "path", list(sys.path))  # the scripts put the repository first
    monkeypatch.setattr(sys, "argv", [str(path), *arguments])
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def parse(name: str, arguments: list[str]) -> list[str]:
    """Runs the command until its flags are parsed; returns what a ``parse_known_args`` left over."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        if name == "bench":
            main = bench_main(arguments[0], arguments[1:], monkeypatch)
            stop_after_parsing(monkeypatch, argparse.ArgumentParser)
        else:
            command_main = importlib.import_module(COMMANDS[name]).main
            stop_after_parsing(monkeypatch, HfArgumentParser)
            main = lambda: command_main(arguments)  # noqa: E731
        try:
            main()
        except Parsed as parsed:
            return parsed.unknown
    pytest.fail(f"{name} {arguments}: ran past its command line without parsing it through argparse")


def runs_whole(command: list[str]) -> bool:
    """The cheap commands, run for real: the audit and the planner on the bundled demo (no model, data or file
    named)."""
    module, arguments = command[2:3], command[3:]
    named = {argument.split("=")[0] for argument in arguments}
    return (
        command[:2] == ["python", "-m"]
        and module in (["hf_lora_ds.audit"], ["hf_lora_ds.plan"])
        and not named & {"--model_name_or_path", "--train_file", "--eval_file"}
        and not any(argument.endswith(ARGUMENT_FILES) for argument in arguments)
    )


def test_the_readme_is_a_front_door():
    lines = read(README).splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)
    linked = {(README.parent / link.split("#")[0]).resolve() for link in links(README)}
    unlinked = [page.name for page in DOCS.glob("*.md") if page.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_link_reaches_a_file_and_heading(page):
    broken = []
    for link in links(page):
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists() or REPO not in target.parents:
            broken.append(f"{link}: no such file")
        elif anchor and (target.suffix != ".md" or anchor not in anchors(target)):
            broken.append(f"{link}: no heading #{anchor} in {target.relative_to(REPO)}")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_repository_path_a_page_names_exists(page):
    named = {path for code in INLINE_CODE.findall(prose(read(page))) for path in REPO_PATH.findall(code)}
    missing = sorted(path for path in named if not (REPO / path).exists() and not any(REPO.glob(path)))
    assert not missing, missing


def test_the_pages_show_commands_of_every_kind():
    """The extraction finds what the pages show: were it to find nothing, every command test would pass on nothing."""
    launchers = {shown.command[0] for shown in OURS}
    assert {"python", "torchrun", "deepspeed", "accelerate", "hf-lora-sft"} <= launchers, launchers
    kinds = {package_command(shown.command)[0] for shown in OURS if shown.command[0] == "python"}
    assert {"run_sft", "audit", "plan", "eval", "merge", "bench"} <= kinds, kinds


@pytest.mark.parametrize("shown", OURS, ids=str)
def test_every_command_a_page_shows_parses(shown, capsys):
    try:
        command = package_command(shown.command)
        assert command is not None, f"{shown}: starts none of this package's commands"
        name, arguments = command
        unknown = parse(name, arguments)
        if name == "bench":  # what a bench script leaves goes to run_sft.py (bench/lora_variants.py -- FLAGS)
            unknown = parse("run_sft", [flag for flag in unknown if flag != "--"])
    except SystemExit as stopped:  # argparse's error (or --help, which runs): its message is on stderr
        assert stopped.code == 0, f"{shown}\n{capsys.readouterr().err}"
        return
    assert not unknown, f"{shown}: unknown argument(s) {unknown}"


RUN_WHOLE = [shown for shown in OURS if runs_whole([token for token in shown.command if token != PLACEHOLDER])]


@pytest.mark.parametrize("shown", RUN_WHOLE, ids=str)
def test_the_cheap_commands_run(shown, tmp_path, monkeypatch, capsys):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path))  # not the user's cache
    name, arguments = package_command(shown.command)
    importlib.import_module(COMMANDS[name]).main(arguments)
    printed = capsys.readouterr().out.splitlines()
    missing = [line for line in shown.output if line not in printed]
    assert not missing, f"{shown}: the page shows lines the command did not print: {missing}"

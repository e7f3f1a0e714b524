"""README.zh-CN.md shows the same two first-screen commands and demo output as README.md, is linked from README.md's
first screen, and every recipe and launch command it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"```(\w*)\n(.*?)```", flags=re.DOTALL)


def first_screen(text: str) -> str:
    """Everything before the first horizontal rule: what a visitor sees before scrolling."""
    return text.split("\n---\n", 1)[0]


def fenced(text: str, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang == language]


def test_chinese_quick_start_shows_the_readme_commands_and_output():
    english = first_screen((ROOT / "README.md").read_text(encoding="utf-8"))
    chinese = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    commands = fenced(english, "bash")
    assert len(commands) == 2, commands  # the demo and the tests
    assert fenced(chinese, "bash")[:2] == commands
    assert fenced(chinese, "")[0] == fenced(english, "")[0]  # the demo's before/after table


def test_readme_links_the_chinese_quick_start_on_its_first_screen():
    assert "(README.zh-CN.md)" in first_screen((ROOT / "README.md").read_text(encoding="utf-8"))


def test_every_path_the_chinese_quick_start_names_exists():
    chinese = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    named = set(re.findall(r"(?:examples|ds_configs)/[\w.\-]+\.(?:yaml|json)", chinese))
    assert any(path.startswith("examples/") for path in named)
    assert {f"ds_configs/stage{n}.json" for n in range(4)} <= named  # the 14B recipe under each ZeRO stage
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, missing

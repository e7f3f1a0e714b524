"""Tests mirror the package: tests/<folder>/test_<module>.py for hf_lora_ds/<folder>/<module>.py."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

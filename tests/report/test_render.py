"""report.html: parse the page, decode every inline image, and check what each section shows."""

from __future__ import annotations

import base64
import io
import json
from html.parser import HTMLParser

import pytest
from PIL import Image

from hf_lora_ds.report import write_report


class _Page(HTMLParser):
    """Collects image sources, headings and all text of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.image_alts: list[str] = []
        self.headings: list[str] = []
        self.text: list[str] = []
        self._in_heading = False

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs)["src"])
            self.image_alts.append(dict(attrs)["alt"])
        self._in_heading = tag in ("h1", "h2")

    def handle_endtag(self, tag):
        self._in_heading = False

    def handle_data(self, data):
        self.text.append(data)
        if self._in_heading:
            self.headings.append(data.strip())


def parse(path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def decode_png(src: str) -> Image.Image:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix)
    image = Image.open(io.BytesIO(base64.b64decode(src[len(prefix) :], validate=True)))
    image.load()  # decodes every pixel; raises on a truncated or corrupt PNG
    return image


def _memory_record(phase, step, peaks):
    return {
        "phase": phase,
        "step": step,
        "ranks": [
            {"rank": r, "cpu": {"before": 500.0, "consumed": 1.0, "peak": p, "total_peak": 500.0 + p}}
            for r, p in enumerate(peaks)
        ],
    }


LOG_HISTORY = [{"loss": 2.0 - 0.1 * step, "learning_rate": 1e-3, "step": step} for step in range(1, 11)] + [
    {"eval_loss": 1.7, "step": 5},
    {"throughput/tokens_per_second": 900.0, "throughput/supervised_tokens_per_second": 400.0, "step": 5},
    {"throughput/padding_efficiency": 0.8, "throughput/mfu": 0.01, "step": 5},
    {"throughput/tokens_per_second": 950.0, "throughput/supervised_tokens_per_second": 420.0, "step": 10},
    {"train_runtime": 12.5, "train_loss": 1.5, "step": 10},
    {"throughput/run_tokens_per_second": 930.0, "throughput/run_mfu": 0.011, "step": 10},
]
MEMORY = [
    _memory_record("load", 0, [40.0, 41.0]),
    _memory_record("eval", 5, [3.0, 5.0]),
    _memory_record("train", 10, [80.0, 120.0]),
]
EVAL_REPORT = {"before": {"accuracy": 0.0, "num_samples": 20}, "after": {"accuracy": 1.0, "num_samples": 20}}


@pytest.fixture
def full_report(tmp_path):
    path = write_report(
        tmp_path,
        LOG_HISTORY,
        memory_records=MEMORY,
        eval_report=EVAL_REPORT,
        arguments={"learning_rate": 1e-3, "output_dir": str(tmp_path), "lora_r": 8},
        deepspeed_config={"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2},
    )
    assert path == tmp_path / "report.html"
    return parse(path)


def test_every_plot_is_an_inline_png_that_decodes(full_report):
    assert len(full_report.images) == 4  # accuracy, loss, memory, throughput
    for src in full_report.images:
        width, height = decode_png(src).size
        assert width > 100 and height > 100


def test_sections_show_the_numbers(full_report):
    text = " ".join(full_report.text)
    assert full_report.headings[1:] == [
        "Accuracy before and after",
        "Loss",
        "Memory per phase and rank",
        "Throughput",
        "LoRA coverage",
        "Arguments",
        "DeepSpeed config",
    ]
    assert "num_samples" in text and "lora_r" in text
    assert '"stage": 3' in text
    assert "throughput/run_mfu" in text and "train_runtime" in text
    assert "120" in text  # rank 1's train peak, in the memory table


def test_accuracy_during_training_is_drawn_beside_the_loss(tmp_path):
    history = [*LOG_HISTORY, {"eval_accuracy": 0.4, "step": 5}, {"eval_accuracy": 0.9, "step": 10}]
    page = parse(write_report(tmp_path, history, eval_report=EVAL_REPORT))
    assert "Loss and accuracy during training" in page.headings
    loss = page.image_alts.index("loss curve")
    assert page.image_alts[loss + 1] == "accuracy during training"
    assert decode_png(page.images[loss + 1]).size[0] > 100


def test_sizes_read_in_mib_and_gib(tmp_path):
    report = {
        side: {
            "accuracy": 0.5,
            "peak_host_rss_bytes": 4088000512,
            "peak_accelerator_bytes": 721223680,
            "reasons": {"no prefix": 3},
        }
        for side in ("before", "after")
    }
    text = " ".join(parse(write_report(tmp_path, LOG_HISTORY, eval_report=report)).text)
    assert "3.81 GiB" in text and "687.8 MiB" in text and "4088000512" not in text
    assert "no prefix: 3" in text


def test_missing_data_is_said_not_failed(tmp_path):
    page = parse(write_report(tmp_path, []))
    assert page.images == []
    text = " ".join(page.text)
    assert "No loss was logged." in text
    assert "No memory trace" in text
    assert "No evaluation report" in text


def test_files_in_output_dir_are_picked_up(tmp_path):
    (tmp_path / "memory_trace.json").write_text(json.dumps(MEMORY))
    (tmp_path / "eval_report.json").write_text(json.dumps(EVAL_REPORT))
    page = parse(write_report(tmp_path, LOG_HISTORY))
    assert len(page.images) == 4
    assert "after" in page.text

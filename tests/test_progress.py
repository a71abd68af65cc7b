"""Progress reporting: bars on a terminal, plain lines (no carriage returns) in log files."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest

from dihal_fast.common import progress as progress_module
from dihal_fast.common.progress import PlainProgress, progress_bar, progress_mode


@pytest.mark.parametrize(
    "value, mode",
    [("0", "off"), ("off", "off"), ("1", "bar"), ("bar", "bar"), ("plain", "plain"), ("auto", "plain"), ("", "plain")],
)
def test_mode_follows_the_switch_and_the_terminal(monkeypatch, value, mode):
    monkeypatch.setenv("DIHAL_PROGRESS", value)
    assert progress_mode() == mode  # pytest's stderr is not a terminal: auto means plain


def test_unknown_switch_warns_and_means_auto(monkeypatch):
    monkeypatch.setenv("DIHAL_PROGRESS", "fancy")
    with pytest.warns(UserWarning, match="DIHAL_PROGRESS='fancy'"):
        assert progress_mode() == "plain"


def test_off_hides_and_bar_draws_a_tqdm_bar(monkeypatch):
    monkeypatch.setenv("DIHAL_PROGRESS", "0")
    with progress_bar(total=3) as bar:
        assert bar.disable
    monkeypatch.setenv("DIHAL_PROGRESS", "1")
    with progress_bar(total=3, file=io.StringIO()) as bar:
        assert not isinstance(bar, PlainProgress) and not bar.disable


def test_plain_lines_at_each_tenth_and_at_the_end_never_a_carriage_return(monkeypatch):
    monkeypatch.setattr(progress_module, "PLAIN_MIN_GAP_S", 0.0)
    log = io.StringIO()
    with PlainProgress(total=1000, desc="scoring", unit="batch", file=log, mininterval=0) as bar:
        for _ in range(1000):
            bar.update(1)
        bar.set_postfix(loss=0.5)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and log.getvalue().endswith("\n")
    assert [re.match(r"scoring: (\d+)% ", line).group(1) for line in lines] == [str(10 * i) for i in range(1, 11)]
    assert lines[-1].startswith("scoring: 100% 1000/1000 [")


def test_plain_lines_are_rate_limited_but_the_last_one_always_comes():
    log = io.StringIO()
    for _ in PlainProgress(range(500), desc="fast", file=log, mininterval=0):
        pass  # well under PLAIN_MIN_GAP_S: no line per tenth
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fast: 100% 500/500 [")
    log = io.StringIO()
    with PlainProgress(desc="open-ended", file=log, mininterval=0) as bar:
        bar.update(7)
    assert log.getvalue().startswith("open-ended: 7 [")


def _logged_run(tmp_path, *argv: str) -> str:
    """stderr of ``dihal ARGV`` run in a fresh process with stderr redirected to a file."""
    log = tmp_path / "stderr.log"
    env = {k: v for k, v in os.environ.items() if k not in ("DIHAL_PROGRESS", "HF_HUB_DISABLE_PROGRESS_BARS")}
    with log.open("w") as handle:
        subprocess.run(
            [sys.executable, "-c", "import sys; from dihal_fast.cli import main; sys.exit(main())", *argv],
            stderr=handle,
            stdout=subprocess.DEVNULL,
            env=env,
            check=True,
            timeout=300,
            cwd=tmp_path,
        )
    return log.read_text()


def test_a_command_logged_to_a_file_has_plain_progress_lines(tiny_checkpoints, tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(
        "\n".join(
            json.dumps({"text": f"Document {i}: the quick brown fox jumps over the lazy dog."}) for i in range(60)
        )
        + "\n"
    )
    text = _logged_run(
        tmp_path,
        "locate",
        "--model",
        str(tiny_checkpoints["llama"]),
        "--corpus",
        str(corpus),
        "--out",
        str(tmp_path / "run"),
        "--seq-len",
        "16",
        "--batch-size",
        "2",
        "--max-tokens",
        "320",
        "--repeats",
        "2",
        "--sample-size",
        "60",
        "--k",
        "4",
        "--n-pairs",
        "100",
        "--device",
        "cpu",
    )
    assert "\r" not in text
    assert re.search(r"^collect: 100% 10/10 \[", text, re.M) and re.search(r"^proxies: 100% 6/6 \[", text, re.M)


def test_hugging_face_bars_stay_out_of_a_log_file(tmp_path):
    text = _logged_run(tmp_path, "generate", "--n-samples", "1", "--max-new-tokens", "2")  # loads the shipped backbone
    assert "\r" not in text and "Loading weights" not in text

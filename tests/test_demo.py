"""``dihal demo`` end to end on a tiny checkpoint (tiny budgets), and its resume."""

from __future__ import annotations

import math

from dihal_fast.cli import main
from dihal_fast.common import read_json
from dihal_fast.evaluate.markdown import METRICS


def _argv(model, corpus, out):
    return [
        "demo",
        "--out",
        str(out),
        "--model",
        str(model),
        "--corpus",
        str(corpus),
        "--locate-max-tokens",
        "1024",
        "--locate-repeats",
        "2",
        "--locate-sample",
        "40",
        "--train-steps",
        "3",
        "--n-samples",
        "3",
        "--max-new-tokens",
        "8",
        "--eval-blocks",
        "2",
        "--val-blocks",
        "2",
        "--seq-len",
        "32",
    ]


def test_demo_runs_end_to_end_and_resumes(tiny_checkpoints, tmp_path, capsys):
    corpus = tmp_path / "text.txt"
    corpus.write_text(
        "\n\n".join(f"Story {i}: a fox and a dog went to the river {i % 7} and read books." for i in range(60))
    )
    out = tmp_path / "demo"
    assert main(_argv(tiny_checkpoints["llama"], corpus, out)) == 0
    report = read_json(out / "report.json")
    locate = read_json(out / "locate" / "locate.json")
    assert report["selected_layer"] == locate["selected_layer"] == report["replace"]["layer"]
    for section in ("backbone", "hybrid"):
        assert all(math.isfinite(report["evaluate"][section][m]) for m in METRICS)
    assert report["targets"]["ppl_ratio"] == report["evaluate"]["hybrid"]["ppl"] / report["evaluate"]["backbone"]["ppl"]
    assert "diffusion_lm" in report["evaluate"]["controls"]
    text = (out / "report.md").read_text()
    for needle in (*METRICS, "![proxies and score against depth](locate/geometry.png)", "Protocol", "Samples"):
        assert needle in text
    assert len(read_json(out / "samples.json")["samples"]) == 6
    first = read_json(out / "timings.json")
    assert not any(v["reused"] for v in first.values())
    assert main(_argv(tiny_checkpoints["llama"], corpus, out)) == 0  # everything reused
    assert read_json(out / "timings.json") == first
    assert read_json(out / "report.json")["evaluate"]["hybrid"] == report["evaluate"]["hybrid"]
    summary = (out / "report.json").read_bytes()
    for extra, field in [(["--train-steps", "4"], "train.steps 3 -> 4"), (["--seed", "1"], "seed 0 -> 1")]:
        assert main([*_argv(tiny_checkpoints["llama"], corpus, out), *extra]) == 2  # refused, never relabelled
        err = capsys.readouterr().err
        assert field in err and "--overwrite" in err and "Traceback" not in err, err
    assert (out / "report.json").read_bytes() == summary and read_json(out / "timings.json") == first

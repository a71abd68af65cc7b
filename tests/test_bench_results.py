"""Bench records and the generated bench/README.md: round trip, determinism, and the document in sync."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402 (from bench/, put on sys.path above)
import render_results  # noqa: E402


def write(tmp_path: Path, question: str = "knn_vs_faiss", **fields) -> Path:
    record = {
        "question": question,
        "title": "t",
        "command": "python bench/x.py",
        "commit": "abc",
        "machine": "m",
        "date": "2026-12-01 11:00",
        "figures": {},
        "targets": [],
        "body": "b",
    }
    record.update(fields)
    path = tmp_path / f"{question}.json"
    path.write_text(json.dumps(record))
    return path


def test_report_round_trip(tmp_path, capsys):
    figures = {
        "times": _common.rows_figure(["method", "s"], [["ours", np.float32(1.5)], ["faiss", 3]]),
        "rate": np.float64(141.0),
        "agreement": 1.0,
        "sizes": np.arange(3),
    }
    targets = [_common.target("time <= FAISS time", "0.15x", True), _common.target("ratio", 0.6, None)]
    path = _common.report(
        "kNN: test",
        "| a |\n|---|\n| 1 |\n",
        question="knn_vs_faiss",
        figures=figures,
        targets=targets,
        results_dir=tmp_path,
    )
    assert path == tmp_path / "knn_vs_faiss.json"
    record = _common.read_record(path)
    assert record["figures"] == {
        "times": {"columns": ["method", "s"], "rows": [["ours", 1.5], ["faiss", 3]]},
        "rate": 141.0,
        "agreement": 1.0,
        "sizes": [0, 1, 2],
    }
    assert [t["status"] for t in record["targets"]] == ["met", "reported"]
    assert record["body"] == "| a |\n|---|\n| 1 |"
    assert record["command"].startswith("python ")
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?|not recorded", record["commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", record["date"])
    assert "cores" in record["machine"]
    assert "| 1 |" in capsys.readouterr().out  # the body is still printed


def test_markdown_tables_read_back_what_table_writes():
    rows = [["ours", 1.5, 2], ["faiss", 0.25, "n/a"], ["**bold**", -3, "1,777"]]
    text = "intro\n\n" + _common.table(["method", "s", "n"], rows) + "\n\nmore\n\n" + _common.table(["a"], [[1]])
    assert _common.markdown_tables(text) == [
        _common.rows_figure(["method", "s", "n"], [["ours", 1.5, 2], ["faiss", 0.25, "n/a"], ["bold", -3, 1777]]),
        _common.rows_figure(["a"], [[1]]),
    ]


def test_legacy_report_call_writes_a_record(tmp_path):
    path = _common.report("HC-DLM vs MDM: sudoku (10 cpu-minutes)", "body", results_dir=tmp_path)
    assert path.name == "hc_dlm_vs_mdm_sudoku_10_cpu_minutes.json"
    assert _common.read_record(path)["title"] == "HC-DLM vs MDM: sudoku (10 cpu-minutes)"


@settings(max_examples=30, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=10,
    )
)
def test_jsonable_gives_strict_json(value):
    text = json.dumps(_common.jsonable({"v": value}), allow_nan=False)
    assert json.loads(text).keys() == {"v"}


def test_unserialisable_figure_is_refused(tmp_path):
    with pytest.raises(TypeError, match="object"):
        _common.report("t", "b", question="x", figures={"bad": object()}, results_dir=tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"commit": ""}, "commit must be non-empty"),
        ({"targets": [{"target": "x", "measured": "1", "status": "ok"}]}, "status in"),
        ({"figures": []}, "figures must be a dict"),
    ],
)
def test_bad_record_names_the_file(tmp_path, fields, message):
    path = write(tmp_path, **fields)
    with pytest.raises((ValueError, TypeError), match=message) as error:
        _common.read_record(path)
    assert str(path) in str(error.value)


def test_missing_field_and_wrong_name_are_refused(tmp_path):
    path = write(tmp_path)
    record = json.loads(path.read_text())
    del record["machine"]
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="lacks machine"):
        _common.read_record(path)
    other = write(tmp_path, question="demo")
    other.rename(tmp_path / "pipeline_targets.json")
    with pytest.raises(ValueError, match="does not match the file name"):
        _common.read_record(tmp_path / "pipeline_targets.json")


def test_render_is_deterministic_and_sectioned(tmp_path):
    write(tmp_path, "demo", body="demo body")
    write(tmp_path, "knn_vs_faiss", body="knn body", targets=[_common.target("faster", "6.7x", True)])
    write(tmp_path, "zz_new_question", title="A new question", body="new body")
    records = render_results.load_records(tmp_path)
    text = render_results.render(records)
    assert text == render_results.render(dict(reversed(list(records.items()))))
    assert text.count("### kNN: dihal_fast vs FAISS") == 1
    assert text.index("knn body") < text.index("demo body") < text.index("new body")  # registry order, then new
    assert "| faster | 6.7x | met |" in text
    assert "add `zz_new_question` to `QUESTIONS`" in text


def test_a_record_of_several_runs_renders_its_runs_table(tmp_path):
    runs = [
        {
            "run": f"seed {s}",
            "record": f"r{s}",
            "command": f"python bench/x.py --seeds {s}",
            "commit": "c" * 40,
            "date": "2026-12-01 11:00",
            "machine": "m",
        }
        for s in (1, 2)
    ]
    write(tmp_path, "demo", body="seeds table", runs=runs, command="one command per run: see the runs table")
    text = render_results.render(render_results.load_records(tmp_path))
    section = text[text.index("### dihal demo") :]
    assert "**Runs.** 2 runs, 2026-12-01 11:00; m;" in section
    assert "**Command.**" not in section  # each run's command is in its row instead
    assert "| seed 2 | `r2` | 2026-12-01 11:00 | cccccccccccc | m | `python bench/x.py --seeds 2` |" in section
    assert "*wrote* is the record it wrote, merged into `demo`" in section
    assert section.index("seeds table") < section.index("**Runs in this record.**")


def merged_demo(tmp_path: Path) -> Path:
    """A merged record ``demo`` of two runs: seed 1 wrote ``demo`` itself, seed 2 wrote ``demo_seed2``."""
    runs = [
        {"run": "seed 1", "record": "demo", "command": "python bench/x.py --seeds 1", "commit": "a" * 40},
        {"run": "seed 2", "record": "demo_seed2", "command": "python bench/x.py --seeds 2", "commit": "b" * 40},
    ]
    for row, date in zip(runs, ("2026-12-01 11:00", "2026-12-02 12:00")):
        row |= {"date": date, "machine": "m"}
    figures = {"demo": {"acc": 1.0}, "demo_seed2": {"acc": 2.0}}
    return write(tmp_path, "demo", runs=runs, figures=figures, command="one command per run: see the runs table")


def unmerged(results_dir: Path) -> Path:
    (results_dir / "unmerged").mkdir(exist_ok=True)
    return results_dir / "unmerged"


@pytest.mark.parametrize("key", ["demo_seed2", "demo"])
def test_a_rerun_of_a_merged_run_is_written_beside_the_merged_record_and_folds_back_in(tmp_path, capsys, key):
    merged_path = merged_demo(tmp_path)
    before = merged_path.read_text()
    path = _common.report("t", "new body", question=key, figures={"acc": 3.0}, results_dir=tmp_path)
    assert path == tmp_path / "unmerged" / f"{key}.json"
    assert merged_path.read_text() == before and sorted(p.name for p in tmp_path.glob("*.json")) == ["demo.json"]
    assert f"--merge {path} --into demo" in capsys.readouterr().out

    assert _common.merge_run(path, "demo", results_dir=tmp_path) == merged_path
    merged = _common.read_record(merged_path)
    assert not path.exists()
    assert merged["figures"][key] == {"acc": 3.0} and len(merged["runs"]) == 2
    other = "demo" if key == "demo_seed2" else "demo_seed2"
    assert merged["figures"][other] == json.loads(before)["figures"][other]
    row = next(r for r in merged["runs"] if r["record"] == key)
    assert row["run"] == ("seed 2" if key == "demo_seed2" else "seed 1")
    assert row["command"] == _common.command_line() and row["date"] != "2026-12-01 11:00"
    assert merged["date"] == f"{min(r['date'] for r in merged['runs'])} to {max(r['date'] for r in merged['runs'])}"


def test_merge_adds_a_named_run_and_refuses_what_it_cannot_place(tmp_path):
    merged_path = merged_demo(tmp_path)
    new = write(unmerged(tmp_path), "demo_seed3")
    with pytest.raises(ValueError, match="pass --run NAME"):
        _common.merge_run(new, "demo", results_dir=tmp_path)
    _common.merge_run(new, "demo", run="seed 3", results_dir=tmp_path)
    assert [r["run"] for r in _common.read_record(merged_path)["runs"]] == ["seed 1", "seed 2", "seed 3"]
    single = write(tmp_path, "knn_vs_faiss")
    with pytest.raises(ValueError, match="no runs table"):
        _common.merge_run(write(unmerged(tmp_path), "demo_seed4"), "knn_vs_faiss", run="x", results_dir=tmp_path)
    assert single.exists()
    with pytest.raises(ValueError, match="needs the fields"):
        _common.validate({**json.loads(merged_path.read_text()), "runs": [{"run": "x"}]}, "r")


def test_render_results_merge_command(tmp_path):
    merged_demo(tmp_path)
    new = write(unmerged(tmp_path), "demo_seed2")
    env = {**os.environ, "DIHAL_BENCH_RESULTS": str(tmp_path)}
    script = [sys.executable, str(BENCH / "render_results.py")]
    done = subprocess.run([*script, "--merge", str(new), "--into", "demo"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not new.exists() and _common.read_record(tmp_path / "demo.json")["runs"][1]["command"] == "python bench/x.py"
    done = subprocess.run([*script, "--merge", str(new), "--into", "demo"], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "demo_seed2.json" in done.stderr


# The checked-in records and documents.

DOCUMENTS = [BENCH / "README.md", BENCH.parent / "README.md", *sorted((BENCH.parent / "docs").glob("*.md"))]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(BENCH.parent)))
def test_documents_describe_what_is_without_issue_numbers(document):
    """The README, docs/ and bench/README.md are current documents: history lives in git and CHANGELOG.md."""
    found = re.findall(r"[^\n]{0,40}\bissues? #?\d+[^\n]{0,20}", document.read_text(), flags=re.IGNORECASE)
    assert not found, f"{document.name} names issue numbers: {found[:3]}"


RECORDS = sorted((BENCH / "results").glob("*.json"))


def test_every_record_is_complete_and_registered():
    assert RECORDS, "bench/results/ holds no records"
    for path in RECORDS:
        record = _common.read_record(path)
        for field in ("command", "commit", "machine", "date"):
            assert record[field].strip(), f"{path.name}: empty {field}"
        assert path.stem in render_results.QUESTIONS, f"{path.name}: add its question to render_results.QUESTIONS"


def test_merged_records_keep_each_runs_figures_under_the_record_it_wrote():
    """Every checked-in merged record (none at present; the merge itself is tested on records made above)."""
    merged = [_common.read_record(path) for path in RECORDS if _common.read_record(path).get("runs")]
    for record in merged:
        wrote = [run["record"] for run in record["runs"]]
        assert len(set(wrote)) == len(wrote), f"{record['question']}: two runs wrote the same record"
        assert set(wrote) <= set(record["figures"]), f"{record['question']}: runs without figures"
        for run in record["runs"]:
            assert _common.merged_into(run["record"], BENCH / "results") == record["question"]


def test_bench_readme_is_the_render_of_the_records():
    expected = render_results.render(render_results.load_records())
    actual = (BENCH / "README.md").read_text()
    assert actual == expected, "bench/README.md is stale or hand-edited: run python bench/render_results.py"


def test_plots_the_records_cite_are_in_bench():
    for path in RECORDS:
        for name in re.findall(r"\(([\w.-]+\.png)\)", _common.read_record(path)["body"]):
            assert (BENCH / name).is_file(), f"{path.name} cites {name}, which is not in bench/"


def test_every_question_a_script_names_is_registered():
    named = {
        key
        for script in BENCH.glob("*.py")
        for key in re.findall(r'question(?:: str)? ?= ?"(\w+)"', script.read_text())
    }
    assert {"knn_vs_faiss", "covariance_throughput", "proxies_vs_sklearn"} <= named
    assert named <= set(render_results.QUESTIONS), f"unregistered: {named - set(render_results.QUESTIONS)}"


def test_protocol_lr_records_merge_and_refuse_a_mismatch(tmp_path, monkeypatch):
    import argparse

    import bench_hcdlm_protocol as protocol

    from dihal_fast.hcdlm.api import file_sha256

    val, other, test = (tmp_path / f"{name}.csv" for name in ("validation", "other", "test"))
    for index, path in enumerate((val, other, test)):
        path.write_text("puzzle,solution\n" + "x,y\n" * index)
    for name, chosen, at, on in (
        ("a", {"hcdlm": 3e-3, "mdm": 3e-3}, "t1", val),
        ("b", {"ccdd": 1e-3}, "t2", other),
        ("c", {"ccdd": 1e-3}, "t3", test),
    ):
        figures = {"chosen": chosen, "validation_sha256": file_sha256(on), "frozen_at": at}
        (tmp_path / f"{name}.json").write_text(json.dumps({"figures": figures}))
    monkeypatch.setattr(protocol, "read_record", lambda path: json.loads(Path(path).read_text()))
    monkeypatch.setattr(protocol, "RESULTS_DIR", tmp_path)
    lrs = {"hcdlm": 3e-3, "mdm": 3e-3, "ccdd": 1e-3}

    def frozen(records: str) -> dict:
        hashes = {"validation_sha256": file_sha256(val), "test_sha256": file_sha256(test)}
        return protocol.frozen_lr(argparse.Namespace(lr_record=records, lrs=lrs, test=str(test), hashes=hashes))

    found = frozen("a,b")
    assert found["lr_record"] == ["a", "b"] and found["lr_frozen_at"] == {"hcdlm": "t1", "mdm": "t1", "ccdd": "t2"}
    assert found["lr_chosen_on"]["ccdd"] == file_sha256(other) and found["lr_carried_over"] == ["ccdd"]
    with pytest.raises(SystemExit, match="is not the lr"):
        frozen("a")
    with pytest.raises(SystemExit, match="on the test file"):
        frozen("a,c")


def test_protocol_variant_parsing():
    import bench_hcdlm_protocol as protocol

    assert protocol.parse_variant("ours") == ("ours", {}, {})
    name, run_fields, sample_fields = protocol.parse_variant("g=guidance_training=true;sample.cfg_weight=2.75")
    assert (name, run_fields, sample_fields) == ("g", {"guidance_training": True}, {"cfg_weight": 2.75})
    with pytest.raises(SystemExit, match="is not FIELD=VALUE"):
        protocol.parse_variant("bad=slot_aux_weight")


def test_protocol_curve_keeps_the_rows_of_other_budgets_and_refuses_another_file_or_grid(tmp_path, monkeypatch):
    import argparse

    import bench_hcdlm_protocol as protocol

    from dihal_fast.hcdlm.api import file_sha256

    val, other = tmp_path / "validation.csv", tmp_path / "other.csv"
    val.write_text("puzzle,solution\nx,y\n")
    other.write_text("puzzle,solution\n")
    header = ["variant", "CPU min", "36 steps %"]
    rows = [["ours", 15, 10.0], ["ours", 30, 20.0]]
    variants = {"ours@15min": {"minutes": 15}, "ours@30min": {"minutes": 30}}
    figures = {"table": {"columns": header, "rows": rows}, "variants": variants, "validation_sha256": file_sha256(val)}
    (tmp_path / "curve.json").write_text(json.dumps({"figures": figures}))
    monkeypatch.setattr(protocol, "read_record", lambda path: json.loads(Path(path).read_text()))
    monkeypatch.setattr(protocol, "RESULTS_DIR", tmp_path)

    def earlier(minutes: float, path: Path = val, columns: list[str] = header, question: str = "curve"):
        args = argparse.Namespace(question=question, val=str(path), minutes=minutes)
        return protocol.earlier_budgets(args, columns)

    assert earlier(30) == ([["ours", 15, 10.0]], {"ours@15min": {"minutes": 15}})
    assert earlier(60) == (rows, variants)
    assert earlier(60, question="none") == ([], {})
    with pytest.raises(SystemExit, match="another validation file"):
        earlier(60, other)
    with pytest.raises(SystemExit, match="other columns"):
        earlier(60, columns=[*header, "50 steps %"])


def test_protocol_keeps_the_choice_apart_from_the_test_file(tmp_path, monkeypatch):
    """A kind's choice on validation is made once and reused for a second test file; a test file already scored with
    the same inputs is read back without any sampling."""
    import argparse
    import types

    import bench_hcdlm_protocol as protocol

    calls: list[str] = []
    run = types.SimpleNamespace(model=None, task=None)
    monkeypatch.setattr(protocol, "train_one", lambda kind, seed, args: (tmp_path / kind, {"step": 5}))
    monkeypatch.setattr(protocol, "load_run", lambda folder, device: run)
    monkeypatch.setattr(protocol, "examples_from_file", lambda task, path: [path])
    monkeypatch.setattr(protocol, "check_run_splits", lambda *a: {"validation": 1, "data": 1})
    monkeypatch.setattr(protocol, "kind_of", lambda model: types.SimpleNamespace(latent=False))
    settings = {"steps": 4, "temperature": 0.0, "reveal_noise": 0.0, "givens": True, "verifier": "chain", "best_of": 1}

    def choice(*args, **kwargs):
        calls.append("choose")
        return {
            "chosen": {"single": settings, "best_of": {**settings, "best_of": 2}},
            "validation": [],
            "validation_n": 1,
        }

    def rows(run, test, single, diverse, seed):
        calls.append(f"score {test[0]}")
        return [{"mode": "single", "test": test[0], "steps": single.steps, "k": diverse.best_of}]

    monkeypatch.setattr(protocol, "protocol_choice", choice)
    monkeypatch.setattr(protocol, "protocol_rows", rows)

    def score(test: str, run_fields: dict | None = None) -> dict:
        hashes = {"test_sha256": test * 64, "validation_sha256": "v" * 64}
        args = argparse.Namespace(
            out=str(tmp_path), k=2, steps_choices=[4, 8], hashes=hashes, val="v", test=test, run_fields=run_fields or {}
        )
        return protocol.run_one("mdm", 0, args)

    first = score("a")
    assert calls == ["choose", "score a"] and first["protocol"]["rows"][0] == {
        "mode": "single",
        "test": "a",
        "steps": 4,
        "k": 2,
    }
    assert score("a") == first and calls == ["choose", "score a"]  # read back
    second = score("b")
    assert calls == ["choose", "score a", "score b"] and second["protocol"]["chosen"] == first["protocol"]["chosen"]
    assert sorted(p.parent.name for p in (tmp_path / "protocol").rglob("*.json")) == [
        "choice",
        "test-aaaaaaaaaaaa",
        "test-bbbbbbbbbbbb",
    ]
    score("a", {"mdm": {"hidden": 128}})  # another shape of the kind: chosen and scored apart
    assert calls[3:] == ["choose", "score a"]
    assert (tmp_path / "protocol" / "choice" / "mdm_hidden=128_seed0.json").is_file()


def test_protocol_run_fields_train_a_kind_in_its_own_folder(tmp_path, monkeypatch):
    """``--run-fields KIND:...`` trains every run of that kind with those fields in ``OUT/variants/FIELDS/``, the
    folder a ``--variant`` with the same fields trains its seed 0 in; other kinds keep ``OUT/KIND_seedS``."""
    import argparse

    import bench_hcdlm_protocol as protocol

    trained = {}
    monkeypatch.setattr(protocol, "train", lambda config, folder: trained.setdefault(folder, config) and {})
    fields = protocol.parse_run_fields(["mdm:hidden=128;baseline_blocks=12"], ["hcdlm", "mdm"])
    assert fields == {"mdm": {"hidden": 128, "baseline_blocks": 12}}
    args = argparse.Namespace(
        out=str(tmp_path), lrs={}, run_fields=fields, sudoku_box="3x3", pool=10, minutes=1.0, checkpoint_every=5
    )
    shaped, _ = protocol.train_one("mdm", 2, args)
    assert shaped == tmp_path / "variants" / "baseline_blocks=12_hidden=128" / "mdm_seed2"
    assert (trained[shaped].model.hidden, trained[shaped].model.baseline_blocks) == (128, 12)
    assert protocol.train_one("mdm", 0, args, fields=fields["mdm"])[0] == shaped.parent / "mdm_seed0"
    assert protocol.train_one("hcdlm", 2, args)[0] == tmp_path / "hcdlm_seed2"
    for bad in ("mdm", "ar:hidden=128", "mdm:hidden", "mdm:sample.steps=3"):
        with pytest.raises(SystemExit, match="--run-fields takes KIND:FIELD=VALUE"):
            protocol.parse_run_fields([bad], ["hcdlm", "mdm"])


def test_protocol_matches_a_baselines_shape_on_sampling_parameters():
    """``--match-sampling KIND:WIDTH,...`` gives the kind the width and blocks of ``matched_shape`` against the
    HC-DLM of the protocol's fields; a malformed one, or one for HC-DLM itself, is refused."""
    import bench_hcdlm_protocol as protocol

    from dihal_fast.hcdlm.models import matched_shape
    from dihal_fast.tasks.sudoku_task import SudokuTask

    found = protocol.sampling_matched(["mdm:64,128", "ccdd:64"], ["hcdlm", "mdm", "ccdd"], "2x3", {})
    mdm = protocol.RunConfig.for_task(name="sudoku", sudoku_box="2x3", kind="mdm").model
    assert found["mdm"] == matched_shape(SudokuTask(2, 3).spec, mdm, (64, 128)) == {"hidden": 128, "baseline_blocks": 3}
    assert found["ccdd"] == {"hidden": 64, "baseline_blocks": 8}
    at64 = protocol.sampling_matched(["mdm:64"], ["hcdlm", "mdm"], "2x3", {})["mdm"]
    deeper = protocol.sampling_matched(["mdm:64"], ["hcdlm", "mdm"], "2x3", {"hcdlm": {"denoiser_blocks": 12}})
    assert at64 == {"hidden": 64, "baseline_blocks": 12} and deeper["mdm"]["baseline_blocks"] > 12  # HC-DLM's fields
    for bad in ("mdm", "mdm:", "mdm:64,x", "hcdlm:64", "ar:64"):
        with pytest.raises(SystemExit, match="--match-sampling takes KIND:WIDTH"):
            protocol.sampling_matched([bad], ["hcdlm", "mdm"], "2x3", {})


def test_a_variant_trains_with_the_kinds_matched_shape_and_its_own_fields_over_it():
    """Regression: ``--variant`` runs took only the variant's fields, so ``--match-sampling`` and ``--run-fields``
    were silently dropped."""
    import argparse

    import bench_hcdlm_protocol as protocol

    shape = protocol.sampling_matched(["mdm:64"], ["mdm"], "2x3", {})["mdm"]
    args = argparse.Namespace(run_fields={"mdm": shape})
    assert protocol.variant_fields("mdm", {}, args) == shape
    assert protocol.variant_fields("mdm", {"baseline_blocks": 2}, args) == {**shape, "baseline_blocks": 2}
    assert protocol.variant_fields("hcdlm", {"latents": 36}, args) == {"latents": 36}


def test_protocol_records_render_as_one_table_of_means():
    """A protocol record's section is the table its figures give (means, differences, cost, settings), not its
    whole body; the differences read as ``points_text`` writes them."""
    from dihal_fast.hcdlm.stats import points_text

    record = _common.read_record(BENCH / "results" / "hcdlm_protocol9.json")
    text = render_results._protocol_summary(record)
    gap = record["figures"]["single_minus_hcdlm"]["mdm"]
    assert render_results._points(gap) == points_text(gap) == "+33.6 [+21.7, +45.3]"
    assert "| mdm | 2,397,065 | 53.1 | 58.6 | 58.6 | +33.6 [+21.7, +45.3] |" in text
    assert "| 600 / 2,592 |" in text and "normal - latent_reencoded +3.7 [-2.0, +9.7] points" in text
    section = render_results._section("hcdlm_protocol9", record)
    assert text in section and record["body"] not in section and len(section.splitlines()) < 30

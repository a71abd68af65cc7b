"""One report type for every entry point: DiHAL stages, HC-DLM training and backbone training."""

from __future__ import annotations

import json

from dihal_fast.common.io import atomic_write_json
from dihal_fast.common.reports import StageReport
from dihal_fast.hcdlm.trainer import train
from dihal_fast.pipeline import StageReport as PipelineStageReport
from dihal_fast.pipeline.reports import LocateReport
from dihal_fast.testing.tiny import hcdlm_tiny_config


def test_the_pipeline_name_is_the_common_type():
    assert PipelineStageReport is StageReport and issubclass(LocateReport, StageReport)


def test_a_report_reads_and_writes_as_the_json_it_holds(tmp_path):
    report = LocateReport(tmp_path, {"selected_layer": 3, "layers": [{"layer": 3, "score": 0.5}]})
    assert report.selected_layer == 3 and dict(report) == report.to_dict() == dict(report.data)
    copy = report.to_dict()
    copy["selected_layer"] = 4  # a copy: the report is unchanged
    assert report["selected_layer"] == 3
    atomic_write_json(tmp_path / "nested.json", {"runs": [report], "plain": 1})
    assert json.loads((tmp_path / "nested.json").read_text()) == {"runs": [dict(report.data)], "plain": 1}


def test_hcdlm_training_returns_a_report_on_its_run_directory(tmp_path):
    report = train(hcdlm_tiny_config(log_every=1, threads=1), tmp_path / "run")
    assert isinstance(report, StageReport) and report.out == tmp_path / "run"
    assert report["step"] == 2 and report["parameters"] > 0 and "loss" in report
    atomic_write_json(tmp_path / "summary.json", {"train": report})
    assert json.loads((tmp_path / "summary.json").read_text())["train"]["step"] == 2

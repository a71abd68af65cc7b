"""lm-evaluation-harness on the backbone and on a tiny hybrid through the harness's own ``HFLM`` (loaded by
path with ``trust_remote_code``, as ``lm_eval --model hf`` does): ``loglikelihood`` equals the model's own
forward pass and is the same twice, and the shipped tasks run end to end, from Python and from the
``lm_eval`` command line. Skipped when the optional extra ``dihal_fast[lm_eval]`` is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is the optional extra dihal_fast[lm_eval]")
pytest.importorskip("accelerate", reason="lm-eval's HF backend needs accelerate (in the extra dihal_fast[lm_eval])")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from dihal_fast.common.assets import DEFAULT_MODEL_DIR  # noqa: E402
from dihal_fast.evaluate import downstream  # noqa: E402

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
# A launcher's variables make accelerate (inside HFLM) start torch.distributed; these tests are one process,
# whatever an earlier test of the session (e.g. `dihal ... --local_rank=0`) left in the environment.
LAUNCHER_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _offline_single_process(monkeypatch):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    for key in LAUNCHER_VARIABLES:
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(scope="module")
def tiny_hybrid_dir(tiny_checkpoints, tmp_path_factory):
    """A tiny Llama hybrid at layer 2 whose bridge output depends on the input, saved as a directory."""
    from dihal_fast.common.hf_loading import load_causal_lm
    from dihal_fast.hybrid import HybridLM

    model, tokenizer = load_causal_lm(tiny_checkpoints["llama"])
    torch.manual_seed(1)
    hybrid = HybridLM.from_backbone(model, 2, {"width": 32, "heads": 2}, tokenizer, tiny_checkpoints["llama"])
    torch.nn.init.normal_(hybrid.bridge.out.weight, std=0.3)
    return hybrid.save_pretrained(tmp_path_factory.mktemp("lm_eval_hybrid") / "hybrid")


def _requests() -> list[Instance]:
    """Real task requests of different lengths (batched together, so padding is exercised), one empty context."""
    lambada = [json.loads(line) for line in (downstream.TASKS_DIR / "dihal_lambada_local.jsonl").open(encoding="utf-8")]
    pairs = [(row["context"][-300:], row["target"]) for row in lambada[::60]] + [("", " Once upon a time")]
    return [Instance("loglikelihood", {}, pair, index) for index, pair in enumerate(pairs)]


def _reference(model, tokenizer, context: str, continuation: str, max_length: int) -> tuple[float, bool]:
    """Log-likelihood of ``continuation`` after ``context`` from one unbatched forward pass, tokenised as the
    harness does (the whole string, split at the context's tokens; an empty context is the BOS token)."""
    if context:
        context_ids = tokenizer.encode(context)
        continuation_ids = tokenizer.encode(context + continuation)[len(context_ids) :]
    else:
        context_ids, continuation_ids = [tokenizer.bos_token_id], tokenizer.encode(continuation)
    ids = torch.tensor([(context_ids + continuation_ids)[-(max_length + 1) :][:-1]])
    with torch.no_grad():
        logprobs = model(ids).logits[0, -len(continuation_ids) :].log_softmax(-1)
    target = torch.tensor(continuation_ids)
    return logprobs.gather(-1, target[:, None]).sum().item(), bool((logprobs.argmax(-1) == target).all())


def _check_loglikelihood(lm: HFLM) -> list[tuple[float, bool]]:
    first, second = lm.loglikelihood(_requests()), lm.loglikelihood(_requests())
    assert first == second
    for (value, greedy), request in zip(first, _requests()):
        expected, expected_greedy = _reference(lm.model, lm.tokenizer, *request.args, lm.max_length)
        assert value == pytest.approx(expected, abs=1e-4) and greedy == expected_greedy
    return first


def test_backbone_loglikelihood_through_hflm_is_its_forward_pass_twice():
    lm = HFLM(pretrained=str(DEFAULT_MODEL_DIR), device="cpu", batch_size=4, dtype="float32")
    results = _check_loglikelihood(lm)
    assert all(value < 0 for value, _ in results)


def test_hybrid_loads_in_hflm_and_scores_deterministically(tiny_hybrid_dir):
    lm = HFLM(pretrained=str(tiny_hybrid_dir), trust_remote_code=True, device="cpu", batch_size=4)
    assert type(lm.model).__name__ == "HybridLM"
    results = _check_loglikelihood(lm)
    again = HFLM(pretrained=str(tiny_hybrid_dir), trust_remote_code=True, device="cpu", batch_size=2)
    fresh = again.loglikelihood(_requests())  # a fresh load, other batches
    assert [v for v, _ in fresh] == pytest.approx([v for v, _ in results], abs=1e-5)
    assert [g for _, g in fresh] == [g for _, g in results]


def test_hflm_passes_bridge_dtype_to_the_hybrid(tiny_hybrid_dir):
    # lm-eval's model_args=pretrained=DIR,dtype=bfloat16,bridge_dtype=float32: a from_pretrained keyword
    for bridge, dtype in (("auto", torch.bfloat16), ("float32", torch.float32)):
        lm = HFLM(pretrained=str(tiny_hybrid_dir), device="cpu", batch_size=4, dtype="bfloat16", bridge_dtype=bridge)
        assert lm.model.bridge.dtype == dtype and lm.model.config.bridge_dtype == bridge
        assert all(value < 0 for value, _ in _check_loglikelihood(lm))


def test_shipped_tasks_end_to_end_on_the_hybrid(tiny_hybrid_dir):
    lm = HFLM(pretrained=str(tiny_hybrid_dir), trust_remote_code=True, device="cpu", batch_size=4)
    results = downstream.run_tasks(lm.model, lm.tokenizer, ",".join(downstream.LOCAL_TASKS), limit=3, lm=lm)
    lambada, cloze = results["dihal_lambada_local"], results["dihal_cloze_local"]
    assert lambada["n"] == cloze["n"] == 3 and lambada["version"] == 1.0
    assert 0 <= lambada["acc"] <= 1 and lambada["perplexity"] > 1 and "acc_stderr" in lambada
    assert all(0 <= cloze[m] <= 1 and f"{m}_stderr" in cloze for m in ("acc", "acc_norm", "acc_mutual_info"))
    assert (
        downstream.run_tasks(lm.model, lm.tokenizer, "dihal_lambada_local", limit=3, lm=lm)["dihal_lambada_local"]
        == lambada
    )


def test_lm_eval_command_line_runs_a_shipped_task_on_a_hybrid_directory(tiny_hybrid_dir, tmp_path):
    command = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={tiny_hybrid_dir},trust_remote_code=True",
        "--device",
        "cpu",
        "--batch_size",
        "4",
        "--tasks",
        "dihal_lambada_local",
        "--include_path",
        str(downstream.TASKS_DIR),
        "--limit",
        "2",
        "--output_path",
        str(tmp_path / "out"),
    ]
    # DISABLE_MULTIPROC: lm-eval's bootstrap stderrs in its own process, not a forked Pool (docs/PIPELINE.md)
    env = {**os.environ, **OFFLINE, "OMP_NUM_THREADS": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    env["DISABLE_MULTIPROC"] = "1"
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = list((tmp_path / "out").rglob("results_*.json"))
    cli = json.loads(path.read_text())["results"]["dihal_lambada_local"]
    lm = HFLM(pretrained=str(tiny_hybrid_dir), trust_remote_code=True, device="cpu", batch_size=4)
    ours = downstream.run_tasks(lm.model, lm.tokenizer, "dihal_lambada_local", limit=2, lm=lm)["dihal_lambada_local"]
    assert cli["acc,none"] == ours["acc"] and cli["perplexity,none"] == pytest.approx(ours["perplexity"], rel=1e-6)


def test_bootstrap_stderrs_are_drawn_in_this_process(monkeypatch):
    """lm-eval's bootstrap standard errors fork a multiprocessing Pool from a process with torch's threads (a
    worker hung forever in CI); run_tasks keeps them in this process, and the switch it sets does not outlive
    the call."""
    import multiprocessing

    def no_pool(*args, **kwargs):
        raise AssertionError("lm-eval forked a multiprocessing Pool")

    monkeypatch.setattr(multiprocessing, "Pool", no_pool)
    monkeypatch.delenv("DISABLE_MULTIPROC", raising=False)
    lm = HFLM(pretrained=str(DEFAULT_MODEL_DIR), device="cpu", batch_size=4, dtype="float32")
    got = downstream.run_tasks(lm.model, lm.tokenizer, "dihal_lambada_local", limit=3, lm=lm)
    assert got["dihal_lambada_local"]["perplexity_stderr"] > 0  # a bootstrapped metric: the Pool's path
    assert "DISABLE_MULTIPROC" not in os.environ


def test_unknown_task_is_one_clear_error_before_any_model_work():
    with pytest.raises(ValueError, match="unknown lm-eval task.*no_such_task.*dihal_lambada_local"):
        downstream.check_tasks("dihal_lambada_local,no_such_task_xyz")


def test_dihal_evaluate_tasks_scores_hybrid_and_backbone_the_same_way(
    tiny_hybrid_dir, tiny_checkpoints, tmp_path, capsys
):
    from dihal_fast.cli import main
    from dihal_fast.common import read_json
    from dihal_fast.common.hf_loading import load_causal_lm

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog. Once upon a time there was a girl.\n\n" * 12)
    argv = [
        "evaluate",
        "--hybrid",
        str(tiny_hybrid_dir),
        "--corpus",
        str(corpus),
        "--out",
        str(tmp_path / "run"),
        "--backbone",
        str(tiny_checkpoints["llama"]),
        "--evaluator",
        str(tiny_checkpoints["llama"]),
        "--seq-len",
        "24",
        "--eval-blocks",
        "2",
        "--n-samples",
        "2",
        "--max-new-tokens",
        "4",
        "--tasks",
        "dihal_lambada_local,dihal_cloze_local",
        "--task-limit",
        "2",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    downstream_section = read_json(tmp_path / "run" / "evaluate.json")["downstream"]
    assert downstream_section["tasks"] == list(downstream.LOCAL_TASKS) and downstream_section["limit"] == 2
    results = downstream_section["results"]
    assert set(results) == {"backbone", "hybrid"} and all(r[t]["n"] == 2 for r in results.values() for t in r)
    assert "| dihal_cloze_local | acc_mutual_info |" in printed
    model, tokenizer = load_causal_lm(tiny_checkpoints["llama"])
    direct = downstream.run_tasks(model, tokenizer, downstream.LOCAL_TASKS, batch_size=8, limit=2)
    assert results["backbone"] == direct  # the backbone's numbers are what run_tasks gives on it alone
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "run" / "sections").glob("downstream_*")}
    assert set(stamps) == {"downstream_backbone.json", "downstream_hybrid.json"}
    assert main(argv) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "run" / "sections").glob("downstream_*")} == stamps
    assert main([*argv[:-4], "--tasks", "no_such_task_xyz"]) == 2
    assert "unknown lm-eval task(s) no_such_task_xyz" in capsys.readouterr().err

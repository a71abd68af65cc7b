"""Bridge training: loss terms, configs, DeepSpeed config checks, learning, kill-and-resume, ZeRO against
plain torch (one process and two processes with torchrun), bad input, and the ``dihal replace`` CLI."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dihal_fast.common.options import add_dataclass_options, dataclass_from_options
from dihal_fast.hybrid import HybridLM
from dihal_fast.replace import BridgeTrainConfig, train_bridge
from dihal_fast.replace.objective import kd_loss, lm_loss
from dihal_fast.train.deepspeed_engine import check_deepspeed_config

WORDS = (
    "the cat dog bird sat ran on under a mat tree house red blue small big and then it was happy sad day night "
    "girl boy saw with to"
).split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A few hundred short synthetic sentences (a corpus that needs no shared data)."""
    generator = torch.Generator().manual_seed(0)
    lines = []
    for _ in range(400):
        picks = torch.randint(0, len(WORDS), (8,), generator=generator).tolist()
        lines.append(" ".join(WORDS[i] for i in picks).capitalize() + ".")
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(lines) + "\n")
    return path


def _config(**overrides) -> BridgeTrainConfig:
    options = dict(
        seq_len=16,
        batch_size=4,
        val_blocks=4,
        stats_blocks=8,
        steps=4,
        checkpoint_every=2,
        log_every=1,
        lr=3e-3,
        warmup_steps=2,
        bridge={"width": 32, "heads": 2, "context_layers": 1, "time_dim": 16},
    )
    return BridgeTrainConfig(**{**options, **overrides})


def test_distillation_and_lm_losses_match_their_formulas():
    generator = torch.Generator().manual_seed(0)
    teacher, student = torch.randn(2, 5, 11, generator=generator), torch.randn(2, 5, 11, generator=generator)
    assert float(kd_loss(teacher, teacher, 2.0)) == pytest.approx(0.0, abs=1e-6)
    for temperature in (1.0, 2.5):
        p = torch.softmax(teacher.double() / temperature, -1)
        q = torch.softmax(student.double() / temperature, -1)
        expected = temperature**2 * (p * (p.log() - q.log())).sum(-1).mean()
        assert float(kd_loss(teacher, student, temperature)) == pytest.approx(float(expected), rel=1e-5)
    ids = torch.randint(0, 11, (2, 5), generator=generator)
    picked = torch.log_softmax(student[:, :-1].double(), -1).gather(-1, ids[:, 1:, None])
    assert float(lm_loss(student, ids)) == pytest.approx(float(-picked.mean()), rel=1e-5)


def test_config_options_round_trip_through_the_command_line():
    parser = argparse.ArgumentParser()
    add_dataclass_options(parser, BridgeTrainConfig)
    assert dataclass_from_options(BridgeTrainConfig, parser.parse_args([])) == BridgeTrainConfig()
    config = dataclass_from_options(
        BridgeTrainConfig,
        parser.parse_args(
            [
                "--steps",
                "7",
                "--w-kd",
                "0",
                "--train-upper",
                "--copied-layers",
                "0",
                "--bridge-nfe",
                "3",
                "--bridge-schedule",
                "flow",
                "--bridge-prediction",
                "velocity",
            ]
        ),
    )
    assert (config.steps, config.w_kd, config.train_upper) == (7, 0.0, True)
    assert config.bridge == {"nfe": 3, "schedule": "flow", "prediction": "velocity"}
    assert BridgeTrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert all(action.help for action in parser._actions if action.dest != "help")


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"steps": 0}, "steps must be >= 1"),
        ({"w_diff": 0, "w_rec": 0, "w_lm": 0, "w_kd": 0}, "nothing to train"),
        ({"bridge": {"depth": 2}}, "unknown bridge options"),
        ({"bridge": {"schedule": "flow", "prediction": "eps"}}, "alpha"),
        ({"ema_decay": 1.0}, "ema_decay"),
    ],
)
def test_train_config_rejects_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        BridgeTrainConfig(**bad)


@pytest.mark.parametrize(
    "ds,match",
    [
        ({"fp16": {"enabled": True}}, "fp16"),
        ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}, "NVMe"),
        ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}, "no GPU"),
        ({"optimizer": {"type": "FusedAdam"}}, "optimizer"),
        ({"scheduler": {"type": "WarmupLR"}}, "scheduler"),
        ({"train_micro_batch_size_per_gpu": 3}, "contradicts"),
        ({"zero_optimization": {"stage": 4}}, "stage must be"),
    ],
)
def test_gpu_only_or_conflicting_deepspeed_configs_are_rejected_on_cpu(ds, match):
    with pytest.raises(ValueError, match=match):
        check_deepspeed_config(ds, _config(), cuda=False)


def test_deepspeed_config_gets_batch_and_clipping_filled_in():
    filled = check_deepspeed_config(
        {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}, "gradient_clipping": "auto"},
        _config(grad_clip=0.5),
        cuda=False,
    )
    assert filled["train_micro_batch_size_per_gpu"] == 4 and filled["gradient_clipping"] == 0.5
    assert filled["gradient_accumulation_steps"] == 1 and filled["bf16"] == {"enabled": True}


def test_training_lowers_the_validation_bridge_loss_and_exports_a_working_hybrid(tiny_checkpoints, corpus, tmp_path):
    result = train_bridge(
        tiny_checkpoints["llama"],
        1,
        corpus,
        tmp_path / "run",
        _config(steps=40, eval_every=20, checkpoint_every=20, copied_layers=0),  # the bridge learns h_1 from c(x)
    )
    history = json.loads((tmp_path / "run" / "validation.json").read_text())["history"]
    assert [h["step"] for h in history] == [20, 40]
    # A fresh bridge predicts the mean (bridge loss ~1); training must explain a real share of the variance.
    assert result["bridge_loss"] < 0.8
    assert result["bridge_loss"] == history[-1]["bridge_loss"]
    assert {"hybrid_ppl", "backbone_ppl", "kl", "protocol"} <= set(result["validation"])
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 41))
    assert records[-1]["rec"] < records[0]["rec"]
    assert (tmp_path / "run" / "loss_curve.png").stat().st_size > 1000
    hybrid = HybridLM.from_pretrained(result["hybrid_dir"])
    assert hybrid.bridge.config.target_std > 0 and hybrid.config.layer == 1
    prompt = hybrid.tokenizer("The cat", return_tensors="pt")["input_ids"]
    text = hybrid.tokenizer.decode(hybrid.generate(prompt, max_new_tokens=8, do_sample=True, eos_token_id=None)[0])
    assert text.startswith("The cat") and len(text) > len("The cat")


def test_train_upper_updates_the_retained_layers_but_not_embeddings_or_head(tiny_checkpoints, corpus, tmp_path):
    from dihal_fast.common.hf_loading import load_causal_lm

    result = train_bridge(tiny_checkpoints["gpt2"], 2, corpus, tmp_path / "run", _config(steps=2, train_upper=True))
    hybrid = HybridLM.from_pretrained(result["hybrid_dir"])
    backbone = load_causal_lm(tiny_checkpoints["gpt2"])[0].state_dict()
    upper = hybrid.upper.state_dict()
    assert not hybrid.config.freeze_upper
    assert not torch.equal(upper["transformer.h.0.mlp.c_fc.weight"], backbone["transformer.h.2.mlp.c_fc.weight"])
    assert torch.equal(upper["transformer.wte.weight"], backbone["transformer.wte.weight"])
    assert torch.equal(hybrid.condition_position_table.weight, backbone["transformer.wpe.weight"])


class _Crash(Exception):
    pass


def test_kill_and_resume_equals_an_uninterrupted_run(tiny_checkpoints, corpus, tmp_path):
    config = _config(steps=6, checkpoint_every=3)
    model = tiny_checkpoints["qwen3"]
    train_bridge(model, 2, corpus, tmp_path / "straight", config)

    def crash(info):
        if info.step == 5:  # after the step-3 checkpoint: steps 4 and 5 are lost, as in a kill
            raise _Crash

    with pytest.raises(_Crash):
        train_bridge(model, 2, corpus, tmp_path / "resumed", config, callback=crash)
    with pytest.raises(ValueError, match="--resume"):
        train_bridge(model, 2, corpus, tmp_path / "resumed", config)
    train_bridge(model, 2, corpus, tmp_path / "resumed", config, resume=True)
    final = "checkpoints/step_00000006"
    for name in ("weights.safetensors", "ema.safetensors"):
        straight, resumed = (
            load_file(tmp_path / "straight" / final / name),
            load_file(tmp_path / "resumed" / final / name),
        )
        assert straight.keys() == resumed.keys()
        assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    steps = [json.loads(line)["step"] for line in (tmp_path / "resumed" / "log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    reports = [
        json.loads((tmp_path / run / "result.json").read_text())["bridge_loss"] for run in ("straight", "resumed")
    ]
    assert reports[0] == reports[1]


def test_a_checkpoint_with_the_old_save_every_key_resumes(tiny_checkpoints, corpus, tmp_path):
    """Checkpoints written before ``save_every`` became ``checkpoint_every`` still resume."""
    config = _config(steps=2, checkpoint_every=1, device="cpu", dtype="float32")  # as saved: resolved

    def crash(info):
        if info.step == 2:
            raise _Crash

    with pytest.raises(_Crash):
        train_bridge(tiny_checkpoints["llama"], 1, corpus, tmp_path, config, callback=crash)
    saved = tmp_path / "checkpoints" / "step_00000001" / "train_config.json"
    old = json.loads(saved.read_text())
    old["save_every"] = old.pop("checkpoint_every")
    saved.write_text(json.dumps(old))
    assert BridgeTrainConfig.from_dict(old) == config
    assert train_bridge(tiny_checkpoints["llama"], 1, corpus, tmp_path, config, resume=True)["hybrid_dir"]


@pytest.mark.parametrize("pointer, problem", [("", "is empty"), ("\n", "is empty"), ("../..", "holds '../..'")])
def test_damaged_latest_pointer_is_named(tmp_path, pointer, problem):
    from dihal_fast.train.checkpoint import latest_checkpoint

    root = tmp_path / "checkpoints"
    (root / "step_00000002").mkdir(parents=True)
    (root / "latest").write_text(pointer)
    with pytest.raises(ValueError, match=f"latest {problem} instead of a checkpoint folder name .*step_00000002"):
        latest_checkpoint(tmp_path)
    (root / "latest").write_text("step_00000002")
    assert latest_checkpoint(tmp_path) == root / "step_00000002"


def test_bad_input_fails_before_any_training(tiny_checkpoints, corpus, tmp_path):
    from transformers import BertConfig

    model = tiny_checkpoints["llama"]
    for layer in (0, 4):
        with pytest.raises(ValueError, match=r"layer must be an integer in 1\.\.3"):
            train_bridge(model, layer, corpus, tmp_path / "a", _config())
    BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64).save_pretrained(
        tmp_path / "bert"
    )
    with pytest.raises(ValueError, match="'bert' cannot be cut into a hybrid: it is a bidirectional encoder"):
        train_bridge(tmp_path / "bert", 1, corpus, tmp_path / "a", _config())
    (tmp_path / "fp16.json").write_text(json.dumps({"zero_optimization": {"stage": 2}, "fp16": {"enabled": True}}))
    with pytest.raises(ValueError, match="fp16"):
        train_bridge(model, 1, corpus, tmp_path / "a", _config(), deepspeed_config=tmp_path / "fp16.json")
    with pytest.raises(FileNotFoundError):
        train_bridge(model, 1, tmp_path / "no-corpus.txt", tmp_path / "a", _config())
    assert not (tmp_path / "a").exists()
    train_bridge(model, 1, corpus, tmp_path / "b", _config(steps=2))
    with pytest.raises(ValueError, match="different settings for \\['lr'\\]"):
        train_bridge(model, 1, corpus, tmp_path / "b", _config(steps=4, lr=1e-2), resume=True)
    optimizer = tmp_path / "b" / "checkpoints" / "step_00000002" / "engine" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    with pytest.raises(ValueError, match="corrupt"):
        train_bridge(model, 1, corpus, tmp_path / "b", _config(steps=4), resume=True)
    (tmp_path / "b" / "checkpoints" / "step_00000002" / "state.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        train_bridge(model, 1, corpus, tmp_path / "b", _config(steps=4), resume=True)
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == ["latest", "step_00000002"]


def _trainable_after_each_step(store: list):
    def callback(info):
        with info.engine.full_parameters() as named:
            store.append({name: p.detach().float().clone() for name, p in named})

    return callback


def test_one_deepspeed_zero2_step_equals_one_plain_torch_step(tiny_checkpoints, corpus, tmp_path):
    config = _config(steps=1)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    plain, zero = [], []
    train_bridge(
        tiny_checkpoints["gpt2"], 2, corpus, tmp_path / "plain", config, callback=_trainable_after_each_step(plain)
    )
    launch_keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env_before = {key: os.environ.get(key) for key in launch_keys}
    train_bridge(
        tiny_checkpoints["gpt2"],
        2,
        corpus,
        tmp_path / "zero",
        config,
        deepspeed_config=tmp_path / "ds.json",
        callback=_trainable_after_each_step(zero),
    )
    # The single-process launch defaults are removed again (importing DeepSpeed may set unrelated variables).
    assert {key: os.environ.get(key) for key in launch_keys} == env_before
    assert plain[0].keys() == zero[0].keys() and len(plain[0]) > 10
    for name in plain[0]:
        torch.testing.assert_close(zero[0][name], plain[0][name], rtol=1e-6, atol=1e-7)
    initial = json.loads((tmp_path / "plain" / "result.json").read_text())
    assert (
        initial["engine"] == "torch"
        and json.loads((tmp_path / "zero" / "result.json").read_text())["engine"] == "deepspeed"
    )


def test_zero3_keeps_the_frozen_teacher_tensors_outside_the_engine(tiny_checkpoints, corpus, tmp_path):
    # ZeRO-3 partitioned every parameter of the engine's module: each frozen retained tensor the hybrid shares with
    # the teacher got a partition copy (its own data emptied) and was gathered whole again for every forward.
    config = _config(steps=1)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    plain, zero, frozen = [], [], []

    def callback(info):
        _trainable_after_each_step(zero)(info)
        frozen.extend(info.engine.module.hybrid.upper.parameters())

    train_bridge(
        tiny_checkpoints["gpt2"], 2, corpus, tmp_path / "plain", config, callback=_trainable_after_each_step(plain)
    )
    train_bridge(
        tiny_checkpoints["gpt2"], 2, corpus, tmp_path / "zero", config, deepspeed_config=tmp_path / "ds.json",
        callback=callback,
    )  # fmt: skip
    assert frozen and all(p.numel() > 0 and not hasattr(p, "ds_id") and not p.requires_grad for p in frozen)
    assert plain[0].keys() == zero[0].keys() and len(plain[0]) > 10
    for name in plain[0]:
        torch.testing.assert_close(zero[0][name], plain[0][name], rtol=1e-6, atol=1e-7)


WORKER = """
import sys, torch
from dihal_fast.replace import BridgeTrainConfig, train_bridge
model, corpus, out, ds = sys.argv[1:5]
config = BridgeTrainConfig(seq_len=16, batch_size=2, val_blocks=2, stats_blocks=4, steps=3, checkpoint_every=2,
                           log_every=1,
                           bridge={"width": 32, "heads": 2, "context_layers": 1, "time_dim": 16})
def dump(info):
    if info.step == config.steps:
        with info.engine.full_parameters() as named:
            torch.save({n: p.detach().float().clone() for n, p in named}, f"{out}/params_rank{info.engine.rank}.pt")
train_bridge(model, 1, corpus, out, config, deepspeed_config=ds, callback=dump)
"""


@pytest.mark.distributed
def test_two_process_zero3_run_ends_with_identical_parameters_on_both_ranks(tiny_checkpoints, corpus, tmp_path):
    (tmp_path / "worker.py").write_text(textwrap.dedent(WORKER))
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    out = tmp_path / "run"
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run(
        [
            torchrun,
            "--nproc_per_node",
            "2",
            "--master_port",
            str(port),
            str(tmp_path / "worker.py"),
            str(tiny_checkpoints["mistral"]),
            str(corpus),
            str(out),
            str(tmp_path / "ds.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(out / f"params_rank{r}.pt") for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys() and len(ranks[0]) > 10
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])
    result = json.loads((out / "result.json").read_text())
    assert result["world_size"] == 2 and result["engine"] == "deepspeed"
    assert (out / "checkpoints" / "step_00000003" / "engine" / "engine").is_dir()
    HybridLM.from_pretrained(result["hybrid_dir"])


def test_replace_cli_trains_from_a_locate_report_and_reports_bad_input(tiny_checkpoints, corpus, tmp_path, capsys):
    from dihal_fast.cli import main

    locate = tmp_path / "locate"
    locate.mkdir()
    (locate / "locate.json").write_text(json.dumps({"selected_layer": 2, "model": str(tiny_checkpoints["llama"])}))
    options = [
        "--corpus",
        str(corpus),
        "--steps",
        "2",
        "--seq-len",
        "16",
        "--batch-size",
        "2",
        "--val-blocks",
        "2",
        "--stats-blocks",
        "4",
        "--bridge-width",
        "32",
        "--bridge-heads",
        "2",
    ]
    assert main(["replace", "--from-locate", str(locate), "--out", str(tmp_path / "run"), *options]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert summary["layer"] == 2 and summary["bridge_loss"] > 0
    hybrid = HybridLM.from_pretrained(tmp_path / "run" / "hybrid")
    assert hybrid.config.layer == 2 and hybrid.config.backbone_dir == str(tiny_checkpoints["llama"].resolve())
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text()[::-1])
    run = ["replace", "--from-locate", str(locate), "--out", str(tmp_path / "run"), "--resume", *options]
    assert main([*run, "--corpus", str(other)]) == 2  # the last --corpus wins: resumed on another corpus
    err = capsys.readouterr().err
    assert "was made with other inputs" in err and "corpus" in err and "Traceback" not in err, err
    assert (
        main(
            [
                "train",
                "--model",
                str(tiny_checkpoints["llama"]),
                "--layer",
                "9",
                "--out",
                str(tmp_path / "bad"),
                *options,
            ]
        )
        == 2
    )
    assert "layer must be an integer in 1..3" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_frozen_retained_layers_share_the_teachers_tensors(tiny_checkpoints, family):
    """One copy of the upper layers, embeddings and head per process: the frozen hybrid references the
    teacher's tensors (``data_ptr`` equal), a hybrid with ``train_upper`` owns copies, and bridge training
    through the shared weights leaves the teacher unchanged."""
    from dihal_fast.common.hf_loading import load_causal_lm
    from dihal_fast.hybrid import backbone_targets
    from dihal_fast.replace import export_hybrid
    from dihal_fast.replace.data import step_generator
    from dihal_fast.replace.objective import BridgeObjective

    backbone, tokenizer = load_causal_lm(tiny_checkpoints[family])
    backbone.requires_grad_(False)
    before = {n: p.clone() for n, p in backbone.named_parameters()}
    teacher = {p.data_ptr() for p in backbone.parameters()}
    config = _config()
    bridge = config.bridge_options(backbone.config.hidden_size, 1)
    frozen = export_hybrid(backbone, tokenizer, 1, bridge, tiny_checkpoints[family], False, {})
    owned = export_hybrid(backbone, tokenizer, 1, bridge, tiny_checkpoints[family], True, {})
    position_table = {id(p) for p in (frozen.upper.base_model.wpe.parameters() if family == "gpt2" else [])}
    shared = [p.data_ptr() in teacher for p in frozen.upper.parameters() if id(p) not in position_table]
    assert shared and all(shared)  # gpt2's zeroed position table is the hybrid's own
    assert not any(p.data_ptr() in teacher for p in owned.upper.parameters())
    objective = BridgeObjective(frozen.train(), config)
    optimizer = torch.optim.AdamW([p for p in objective.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, backbone.config.vocab_size, (2, 16))
    hidden, logits = backbone_targets(backbone, ids, 1)
    losses = objective(
        input_ids=ids,
        target_hidden=hidden,
        teacher_logits=logits,
        **objective.random_inputs(2, 16, step_generator(0, 0, 0)),
    )
    losses["loss"].backward()
    optimizer.step()
    assert all(torch.equal(p, before[n]) for n, p in backbone.named_parameters())


def test_backbone_gradient_accumulation_equals_the_large_batch(corpus, tmp_path):
    """``dihal backbone train --grad-accum-steps 2 --batch-size 2`` trains on the windows of ``--batch-size 4``."""
    from dihal_fast.backbone.config import BackboneModelConfig, BackboneTrainConfig
    from dihal_fast.backbone.train import train_backbone

    def config(batch_size: int, accum: int) -> BackboneTrainConfig:
        model = BackboneModelConfig(
            vocab_size=300, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seq_len=16
        )
        return BackboneTrainConfig(
            corpus=[str(corpus)],
            model=model,
            steps=3,
            batch_size=batch_size,
            grad_accum_steps=accum,
            lr=1e-2,
            warmup_steps=1,
            eval_every=3,
            eval_windows=2,
            checkpoint_every=3,
            precision="fp32",
        )

    big = train_backbone(config(4, 1), tmp_path / "big", progress=False)
    accumulated = train_backbone(config(2, 2), tmp_path / "accum", progress=False)
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("big", "accum"))
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-5)  # AdamW: float rounding of tiny gradients
    assert accumulated["train_tokens_seen"] == big["train_tokens_seen"] == 3 * 4 * 16


def test_a_relative_out_gives_a_result_that_evaluate_reads_from_any_directory(
    tiny_checkpoints, corpus, tmp_path, monkeypatch
):
    from dihal_fast.evaluate.loaded_lm import replace_run

    monkeypatch.chdir(tmp_path)
    train_bridge(tiny_checkpoints["llama"], 1, corpus, Path("runs") / "replace", _config(steps=1))
    hybrid, _ = replace_run(Path("runs") / "replace")
    assert hybrid.resolve() == (tmp_path / "runs" / "replace" / "hybrid").resolve()

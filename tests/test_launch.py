"""Launchers and devices: the torchrun / deepspeed / srun contracts (``--local_rank``, ``RANK``/``WORLD_SIZE``, SLURM's
variables), the SLURM node-list parser, one ``--device``/``--dtype`` handling, and 2-process gloo runs of
``dihal locate`` through each launcher form that runs on a CPU machine."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dihal_fast.common import launch
from dihal_fast.common.devices import checkpoint_dtype_name, dtype_name, resolve_device, resolve_dtype
from dihal_fast.common.launch import LaunchInfo, expand_nodelist, first_host, launcher_env, set_local_rank

LAUNCH_VARS = (
    *launch.TORCH_VARS,
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_JOB_ID",
)


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node07", ["node07"]),
        ("node[01-04]", ["node01", "node02", "node03", "node04"]),
        ("gpu[8-10,12]", ["gpu8", "gpu9", "gpu10", "gpu12"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("a[1-2],b3,c[5]-ib", ["a1", "a2", "b3", "c5-ib"]),
    ],
)
def test_slurm_node_lists_expand(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["node[3-1]", "node[a-b]", "node[1-2", ""])
def test_unparseable_node_lists_name_master_addr(nodelist):
    with pytest.raises(ValueError, match="MASTER_ADDR|SLURM"):
        expand_nodelist(nodelist) if nodelist else first_host(nodelist)


@given(
    prefix=st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True).filter(lambda p: not p[-1].isdigit()),
    low=st.integers(0, 500),
    span=st.integers(0, 20),
    width=st.integers(1, 4),
)
def test_a_padded_range_expands_to_every_host_in_order(prefix, low, span, width):
    high = low + span
    hosts = expand_nodelist(f"{prefix}[{low:0{width}d}-{high:0{width}d}]")
    assert hosts == [f"{prefix}{i:0{width}d}" for i in range(low, high + 1)]


def test_first_host_without_scontrol_parses_the_list(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert first_host("cn[003-004],login1") == "cn003"


def test_first_host_asks_scontrol_when_it_is_on_path(tmp_path, monkeypatch):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf \'weird-a7\\nweird-b2\\n\'\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert first_host("weird-{a7,b2}") == "weird-a7"  # a form the built-in parser does not read


def test_srun_without_torchrun_maps_slurm_onto_torch_variables(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    env = {
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "8",
        "SLURM_JOB_NODELIST": "gpu[11-14]",
        "SLURM_JOB_ID": "123456",
    }
    assert launcher_env(env) == LaunchInfo(rank=5, local_rank=1, world_size=8, launcher="slurm")
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("5", "1", "8")
    assert env["MASTER_ADDR"] == "gpu11" and env["MASTER_PORT"] == str(15000 + 123456 % 20000)
    step = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "8",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_NODELIST": "a1",
        "MASTER_ADDR": "10.0.0.1",
    }
    assert launcher_env(step).world_size == 2 and step["MASTER_ADDR"] == "10.0.0.1" and step["MASTER_PORT"] == "29500"


def test_torchrun_variables_win_over_slurm_and_one_task_is_no_job():
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}
    assert launcher_env(env) == LaunchInfo(1, 1, 2, "torchrun")
    single = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "n1"}
    assert launcher_env(single) == LaunchInfo(0, 0, 1, "none") and "RANK" not in single
    assert launcher_env({}) == LaunchInfo(0, 0, 1, "none")


@pytest.mark.parametrize(
    "env, match",
    [
        ({"WORLD_SIZE": "2"}, "RANK is not set; launch with torchrun --nproc_per_node 2"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 must be smaller than WORLD_SIZE=2"),
        ({"WORLD_SIZE": "two", "RANK": "0"}, "WORLD_SIZE must be an integer >= 1, got 'two'"),
        ({"SLURM_PROCID": "-1", "SLURM_NTASKS": "2"}, "SLURM_PROCID must be an integer"),
    ],
)
def test_inconsistent_launcher_variables_are_one_line(env, match):
    with pytest.raises(ValueError, match=match):
        launcher_env(env)


def test_local_rank_flag_sets_the_environment_and_refuses_a_contradiction():
    env: dict[str, str] = {}
    set_local_rank(3, env)
    assert env == {"LOCAL_RANK": "3"}
    set_local_rank(3, env)
    with pytest.raises(ValueError, match="contradicts LOCAL_RANK=3"):
        set_local_rank(1, env)


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variables, and whatever a test sets (``--local_rank`` writes ``LOCAL_RANK``) undone after it:
    setenv first so that monkeypatch records each variable, also one that was absent."""
    for key in LAUNCH_VARS:
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)


@pytest.mark.parametrize(
    "argv",
    [
        ["--local_rank=1", "info"],  # where the deepspeed launcher puts it: before the sub-command
        ["--local-rank", "1", "info"],  # torch.distributed.launch's spelling
        ["info", "--local_rank=1"],
        ["replace", "--local_rank=1", "--out", "run", "--layer", "2"],
        ["train", "--local-rank=1", "--out", "run", "--layer", "2"],  # an alias
        ["backbone", "train", "--local_rank=1", "--out", "run", "--corpus", "c.txt"],
        ["hcdlm", "train", "--local_rank", "1", "--out", "run", "--task", "sudoku"],
    ],
)
def test_every_command_accepts_local_rank(clean_env, argv):
    from dihal_fast.cli import build_parser

    args = build_parser().parse_args(argv)
    assert os.environ["LOCAL_RANK"] == "1" and not hasattr(args, "local_rank")


def test_local_rank_contradicting_the_environment_is_a_usage_error(clean_env, monkeypatch, capsys):
    from dihal_fast.cli import main

    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(SystemExit) as exit_info:
        main(["--local_rank=1", "info"])
    assert exit_info.value.code == 2 and "contradicts LOCAL_RANK=0" in capsys.readouterr().err


def test_device_auto_is_cpu_here_and_unavailable_devices_are_refused():
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="not a torch device"):
        resolve_device("gpu0")
    with pytest.raises(ValueError, match="only cpu and cuda"):
        resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA device here; use --device cpu or auto"):
            resolve_device("cuda:1")


@pytest.mark.parametrize(
    "config, expected",
    [
        ({"dtype": "bfloat16"}, "bfloat16"),
        ({"torch_dtype": "float16"}, "float16"),
        ({}, "float32"),
        ({"torch_dtype": "torch.bfloat16"}, "bfloat16"),
    ],
)
def test_dtype_auto_is_the_checkpoints_own(tmp_path, config, expected):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert checkpoint_dtype_name(tmp_path) == dtype_name("auto", tmp_path) == expected
    assert resolve_dtype("auto", tmp_path) == getattr(torch, expected)
    assert dtype_name("float64", tmp_path) == "float64"  # an explicit dtype wins


def test_bad_dtypes_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "int8"}))
    with pytest.raises(ValueError, match="declares dtype 'int8'; pass --dtype"):
        dtype_name("auto", tmp_path)
    with pytest.raises(ValueError, match="dtype must be one of auto"):
        dtype_name("half", tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json does not exist"):
        dtype_name("auto", tmp_path / "missing")


def test_a_bfloat16_checkpoint_loads_as_bfloat16_by_default(tmp_path):
    from dihal_fast.common.hf_loading import load_causal_lm
    from dihal_fast.testing import make_tiny_checkpoint

    path = make_tiny_checkpoint(tmp_path / "llama", "llama")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    model, _ = load_causal_lm(path, "auto", "auto")
    assert next(model.parameters()).dtype == torch.bfloat16
    model, _ = load_causal_lm(path, "float32", "cpu")
    assert next(model.parameters()).dtype == torch.float32


@pytest.mark.parametrize("command", [["locate", "--out", "{out}"], ["replace", "--out", "{out}", "--layer", "1"]])
def test_an_unavailable_device_is_one_line_before_any_work(command, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device, so --device cuda is available")
    from dihal_fast.cli import main

    argv = [a.format(out=tmp_path / "run") for a in command]
    assert main([*argv, "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torch sees no CUDA device here" in err
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "collect").exists()


# ---- two gloo processes through each launcher ---------------------------------------------------------------------

SEQ_LEN, BLOCKS = 16, 12
LOCATE = [
    "--seq-len",
    str(SEQ_LEN),
    "--batch-size",
    "3",
    "--max-tokens",
    str(SEQ_LEN * BLOCKS),
    "--repeats",
    "2",
    "--sample-size",
    "60",
    "--k",
    "8",
    "--n-pairs",
    "200",
    "--device",
    "cpu",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.is_file():
        pytest.skip(f"{name} is not installed next to {sys.executable}")
    return str(path)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    return {**env, "OMP_NUM_THREADS": "1", "DIHAL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def locate_inputs(tmp_path_factory):
    from dihal_fast.testing import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("launch")
    model = make_tiny_checkpoint(root / "qwen3", "qwen3")
    words = ["the", "cat", "dog", "sat", "ran", "on", "a", "mat", "tree", "red", "blue", "small", "big", "and", "then"]
    generator = torch.Generator().manual_seed(0)
    lines = [
        " ".join(words[i] for i in torch.randint(0, len(words), (10,), generator=generator).tolist())
        for _ in range(200)
    ]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n")
    return ["--model", str(model), "--corpus", str(root / "corpus.txt"), *LOCATE]


@pytest.fixture(scope="module")
def one_process_report(locate_inputs, tmp_path_factory):
    from dihal_fast.cli import main

    out = tmp_path_factory.mktemp("one") / "run"
    assert main(["locate", *locate_inputs, "--out", str(out)]) == 0
    return json.loads((out / "locate.json").read_text())


def _check_two_process_run(out: Path, one: dict) -> None:
    two = json.loads((out / "locate.json").read_text())
    assert two["config"]["world_size"] == 2
    assert (two["n_tokens"], two["n_blocks"], two["selected_layer"]) == (
        one["n_tokens"],
        one["n_blocks"],
        one["selected_layer"],
    )
    for name, values in one["per_repeat"].items():
        np.testing.assert_allclose(two["per_repeat"][name], values, rtol=1e-4, atol=1e-6, err_msg=name)
    assert sorted(p.name for p in (out / "collect").glob("state-*.json")) == [
        "state-rank0000-of-0002.json",
        "state-rank0001-of-0002.json",
    ]


@pytest.mark.distributed
def test_locate_under_the_deepspeed_launcher(locate_inputs, one_process_report, tmp_path):
    """The real ``deepspeed`` launcher: on a CPU machine its CPU accelerator accepts ``--num_gpus 2`` and starts two
    processes with ``--local_rank=N`` before the sub-command and RANK/LOCAL_RANK/WORLD_SIZE/MASTER_* set."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "run"
    cmd = [
        _bin("deepspeed"),
        "--num_gpus",
        "2",
        "--master_port",
        str(_free_port()),
        _bin("dihal"),
        "locate",
        *locate_inputs,
        "--keep-checkpoints",  # checked below: each process's collection state
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--local_rank=0" in proc.stdout + proc.stderr  # the launcher logs the command it spawned
    _check_two_process_run(out, one_process_report)


@pytest.mark.distributed
def test_locate_under_srun_without_torchrun(locate_inputs, one_process_report, tmp_path):
    """What ``srun --ntasks 2 dihal locate ...`` gives each task: SLURM's variables only (set here by hand)."""
    out = tmp_path / "run"
    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = {
            **_env(),
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_JOB_NODELIST": "localhost",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [_bin("dihal"), "locate", *locate_inputs, "--keep-checkpoints", "--out", str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    assert "selected layer" in results[0][0] and "selected layer" not in results[1][0]  # rank 0 reports
    _check_two_process_run(out, one_process_report)


def test_the_shipped_deepspeed_examples_are_package_data_and_valid(capsys):
    from dihal_fast.cli import main
    from dihal_fast.common.assets import EXAMPLES_DIR
    from dihal_fast.train import LoopSettings
    from dihal_fast.train.deepspeed_engine import load_deepspeed_config

    assert main(["info", "--examples"]) == 0
    folder = Path(capsys.readouterr().out.strip())
    assert folder == EXAMPLES_DIR and folder.is_relative_to(Path(__import__("dihal_fast").__file__).parent)
    names = sorted(p.name for p in folder.glob("ds_*.json"))
    assert names == ["ds_zero2.json", "ds_zero2_bf16.json", "ds_zero3.json"]
    settings = LoopSettings(steps=1, batch_size=4, lr=1e-3, warmup_steps=0, grad_accum_steps=2)
    for name in names:
        filled = load_deepspeed_config(folder / name, settings, cuda=False)
        assert (filled["train_micro_batch_size_per_gpu"], filled["gradient_accumulation_steps"]) == (4, 2)


REPLACE = [
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
    "--checkpoint-every",
    "1",
]


def test_replace_with_device_and_dtype_auto_saves_what_ran(locate_inputs, tmp_path, capsys):
    from dihal_fast.cli import main

    model, corpus = locate_inputs[1], locate_inputs[3]
    out = tmp_path / "run"
    code = main(
        [
            "replace",
            "--model",
            model,
            "--corpus",
            corpus,
            "--layer",
            "1",
            "--out",
            str(out),
            *REPLACE,
            "--device",
            "auto",
            "--dtype",
            "auto",
            "--grad-accum-steps",
            "2",
        ]
    )
    assert code == 0, capsys.readouterr().err
    saved = json.loads((out / "train_config.json").read_text())
    assert (saved["device"], saved["dtype"], saved["grad_accum_steps"]) == (str(resolve_device("auto")), "float32", 2)


@pytest.mark.distributed
def test_replace_under_torchrun_with_deepspeed_and_gradient_accumulation(locate_inputs, tmp_path):
    """Two torchrun processes, ZeRO-2 from the shipped example config, 2 micro-batches of 2 per step and process."""
    from dihal_fast.common.assets import EXAMPLES_DIR

    model, corpus = locate_inputs[1], locate_inputs[3]
    out = tmp_path / "run"
    cmd = [
        _bin("torchrun"),
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
        _bin("dihal"),
        "replace",
        "--model",
        model,
        "--corpus",
        corpus,
        "--layer",
        "1",
        "--out",
        str(out),
        *REPLACE,
        "--grad-accum-steps",
        "2",
        "--deepspeed",
        str(EXAMPLES_DIR / "ds_zero2.json"),
    ]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert (result["world_size"], result["engine"], result["last_checkpoint_step"]) == (2, "deepspeed", 2)
    assert json.loads((out / "train_config.json").read_text())["grad_accum_steps"] == 2
    assert proc.stderr.count("hybrid written to") == 1  # rank 0 reports, beside its log
    assert json.loads(proc.stdout)["layer"] == 1  # stdout is rank 0's JSON line alone, DeepSpeed's log elsewhere

"""The one safe writer (issue 21): no write through a symbolic link, outputs of the wrong kind refused up front,
``open()``'s permissions whatever the writer, no temporary left by a full disk."""

from __future__ import annotations

import errno
import json
import os
import stat

import pytest

from dihal_fast.cli import main
from dihal_fast.common import atomic_write_bytes, atomic_write_json
from dihal_fast.common.io import append_line, atomic_directory, make_directories
from dihal_fast.common.rundir import LOCK_NAME, run_directory
from dihal_fast.hcdlm.config import HCDLMModelConfig, HCDLMTrainConfig, RunConfig
from dihal_fast.hcdlm.trainer import train
from dihal_fast.tasks.registry import TaskConfig
from dihal_fast.testing.tiny import HCDLM_TINY_ARGS


@pytest.fixture
def precious(tmp_path):
    """A file outside the run directory that a link points to; the test checks it is never touched."""
    path = tmp_path / "precious.txt"
    path.write_text("do not touch\n")
    yield path
    assert path.read_text() == "do not touch\n"


def _one_line(capsys) -> str:
    """The one error line the command printed (progress bars aside), with no traceback."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path, precious, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).symlink_to(precious)
    with pytest.raises(ValueError, match="symbolic link"):
        with run_directory(run, "dihal locate"):
            pytest.fail("entered a run directory through a symlinked lock")
    assert main(["locate", "--model", str(tmp_path), "--corpus", str(precious), "--out", str(run)]) == 2
    assert "symbolic link" in _one_line(capsys)
    assert (run / LOCK_NAME).is_symlink()


def test_a_symlinked_lock_to_a_missing_file_creates_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="symbolic link"), run_directory(run, "dihal locate"):
        pass
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize(
    "target", ["locate.json", "collect/state.safetensors", "checkpoints/step_00000001/weights.safetensors"]
)
def test_no_file_of_a_run_is_written_through_a_link(tmp_path, precious, target):
    run = tmp_path / "run"
    first = target.split("/")[0]
    (run / first).parent.mkdir(parents=True, exist_ok=True)
    if "/" in target:  # a linked folder on the way: the file would land outside the run
        outside = tmp_path / "outside"
        outside.mkdir()
        (run / first).symlink_to(outside)
    else:
        (run / first).symlink_to(precious)
    with run_directory(run, "dihal test", resume=True):  # an earlier run's directory, its entries replaced by links
        with pytest.raises(ValueError, match="symbolic link"):
            atomic_write_json(run / target, {"x": 1})
        with pytest.raises(ValueError, match="symbolic link"):
            append_line(run / target, "{}")
    assert not any((tmp_path / "outside").rglob("*")) if "/" in target else True


def test_outside_a_run_only_the_target_itself_must_not_be_a_link(tmp_path, precious):
    linked = tmp_path / "linked"
    linked.symlink_to(precious)
    with pytest.raises(ValueError, match="symbolic link"):
        atomic_write_bytes(linked, b"x")
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)  # a user's --out through a link of their own is fine
    atomic_write_bytes(tmp_path / "alias" / "out.txt", b"x")
    assert (real / "out.txt").read_bytes() == b"x"


def test_a_symlinked_checkpoint_folder_is_refused(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (run / "checkpoints" / "step_00000001").symlink_to(outside)
    with run_directory(run, "dihal test", resume=True):
        with pytest.raises(ValueError, match="symbolic link"), atomic_directory(run / "checkpoints" / "step_00000001"):
            pytest.fail("wrote a folder through a link")
    assert not any(outside.iterdir())


@pytest.mark.parametrize("kind", ["file where a folder goes", "folder where a file goes"])
def test_outputs_of_the_wrong_kind_are_refused_before_the_work(tmp_path, kind):
    run = tmp_path / "run"
    run.mkdir()
    if kind == "file where a folder goes":
        (run / "hybrid").write_text("")
        with pytest.raises(ValueError, match="is a file"), run_directory(run, "dihal replace", folders=("hybrid",)):
            pytest.fail("work started")
    else:
        (run / "locate.json").mkdir()
        with (
            pytest.raises(ValueError, match="is a directory"),
            run_directory(run, "dihal locate", files=("locate.json",)),
        ):
            pytest.fail("work started")
        with pytest.raises(ValueError, match="is a directory"):
            atomic_write_json(run / "locate.json", {})


@pytest.mark.parametrize(
    ("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775), (0o077, 0o600, 0o700)]
)
def test_written_files_get_the_permissions_open_would_give(tmp_path, umask, file_mode, dir_mode):
    old = os.umask(umask)
    try:
        written = [atomic_write_bytes(tmp_path / "a.bin", b"x"), atomic_write_json(tmp_path / "sub" / "b.json", {})]
        append_line(tmp_path / "log.jsonl", "{}")
        written.append(tmp_path / "log.jsonl")
        with atomic_directory(tmp_path / "folder") as tmp:
            (tmp / "inner.txt").write_text("x")
        folders = [tmp_path / "sub", tmp_path / "folder", make_directories(tmp_path / "x" / "y")]
    finally:
        os.umask(old)
    assert [oct(stat.S_IMODE(p.stat().st_mode)) for p in written] == [oct(file_mode)] * 3
    assert [oct(stat.S_IMODE(p.stat().st_mode)) for p in folders] == [oct(dir_mode)] * 3


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("call", ["write", "fsync"])
def test_a_full_disk_leaves_no_temporary_and_names_the_file(tmp_path, monkeypatch, call):
    atomic_write_json(tmp_path / "state.json", {"old": True})
    monkeypatch.setattr(os, call, _full_disk)
    with pytest.raises(OSError, match="cannot write .*state.json: No space left") as info:
        atomic_write_json(tmp_path / "state.json", {"new": True})
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    assert json.loads((tmp_path / "state.json").read_text()) == {"old": True}


def test_a_full_disk_in_hcdlm_train_leaves_no_checkpoint_temporary_and_one_line(tmp_path, monkeypatch, capsys):
    from dihal_fast.train import checkpoint

    monkeypatch.setattr(checkpoint, "save_file", _full_disk)
    run = tmp_path / "run"
    code = main(
        [
            "hcdlm",
            "train",
            "--task",
            "sudoku",
            "--sudoku-box",
            "2x2",
            "--sudoku-pool",
            "20",
            "--out",
            str(run),
            "--steps",
            "2",
            *HCDLM_TINY_ARGS,
        ]
    )
    assert code != 0
    assert "No space left on device" in _one_line(capsys)
    assert not list(run.rglob(".tmp_*")) and not (run / LOCK_NAME).exists()


def test_a_checkpoint_interrupted_while_written_keeps_the_previous_one(tmp_path, monkeypatch):
    config = RunConfig(
        task=TaskConfig("sudoku", sudoku_box="2x2", sudoku_pool=20),
        model=HCDLMModelConfig(
            hidden=32, heads=2, encoder_blocks=1, denoiser_blocks=1, predictor_blocks=1, latent_dim=8
        ),
        train=HCDLMTrainConfig(steps=4, batch_size=8, checkpoint_every=2),
    )
    from dihal_fast.train import checkpoint

    real, calls = checkpoint.save_file, []

    def fails_on_the_second_checkpoint(tensors, path):
        calls.append(path)
        if "step_00000004" in path:
            raise KeyboardInterrupt
        real(tensors, path)

    monkeypatch.setattr(checkpoint, "save_file", fails_on_the_second_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        train(config, tmp_path)
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_00000002"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_00000002"]


def test_a_hybrid_is_never_saved_through_a_link(tmp_path, precious, tiny_checkpoints):
    """save_pretrained writes file by file into the folder (as transformers does): a weight file replaced by a
    link is refused in one line before anything is written, the folder's other files stay."""
    from dihal_fast.common.hf_loading import load_causal_lm
    from dihal_fast.hybrid import HybridLM

    model, tokenizer = load_causal_lm(tiny_checkpoints["llama"], "float32", "cpu")
    hybrid = HybridLM.from_backbone(model, 1, tokenizer=tokenizer, backbone_dir=tiny_checkpoints["llama"])
    out = tmp_path / "hybrid"
    out.mkdir()
    (out / "model.safetensors").symlink_to(precious)  # an earlier export's file replaced by a link
    (out / "notes.txt").write_text("the user's")
    with pytest.raises(ValueError, match="model.safetensors is a symbolic link"):
        hybrid.save_pretrained(out)
    assert sorted(path.name for path in out.iterdir()) == ["model.safetensors", "notes.txt"]
    (out / "model.safetensors").unlink()
    hybrid.save_pretrained(out)
    assert (out / "notes.txt").read_text() == "the user's" and not list(out.glob(".*"))
    assert HybridLM.from_pretrained(out).config.layer == 1


def _hcdlm_argv(out, steps: int = 4) -> list[str]:
    return [
        "hcdlm",
        "train",
        "--task",
        "sudoku",
        "--sudoku-box",
        "2x2",
        "--sudoku-pool",
        "20",
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--checkpoint-every",
        "2",
        *HCDLM_TINY_ARGS,
    ]


@pytest.mark.parametrize(
    "message",
    [
        "[enforce fail at inline_container.cc:626] . unexpected pos 3008 vs 2942",
        "basic_ios::clear: iostream error",
    ],
)
def test_a_failed_torch_save_is_one_line_naming_the_file_and_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch, capsys, message
):
    import torch

    from dihal_fast.train import engines

    real = torch.save

    def fails_at_step_four(obj, path, *args, **kwargs):
        if "step_00000004" in str(path):
            raise RuntimeError(message)
        real(obj, path, *args, **kwargs)

    monkeypatch.setattr(engines.torch, "save", fails_at_step_four)
    run = tmp_path / "run"
    assert main(_hcdlm_argv(run)) == 1
    line = _one_line(capsys)
    assert "cannot write" in line and "optimizer.pt" in line and "step_00000004" in line
    assert (run / "checkpoints" / "latest").read_text() == "step_00000002"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_00000002"]
    assert not (run / LOCK_NAME).exists()


def test_a_failed_safetensors_write_is_one_dihal_io_error_naming_the_target(tmp_path):
    from safetensors import SafetensorError

    from dihal_fast.common.io import writing
    from dihal_fast.errors import DihalIOError

    full = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
    with pytest.raises(DihalIOError, match=f"cannot write {tmp_path / 'hybrid'}: .*No space left") as info:
        with writing(tmp_path / "hybrid"):
            raise SafetensorError(full)
    assert "\n" not in str(info.value)
    with pytest.raises(SafetensorError, match="header too large"), writing(tmp_path / "hybrid"):
        raise SafetensorError("header too large")  # not a failed write: passes through as the bug it is


def _tree_bytes(path) -> int:
    """What ``path`` takes on a tmpfs: every file rounded up to whole 4 KiB pages."""
    return sum(-(-p.stat().st_size // 4096) * 4096 for p in path.rglob("*") if p.is_file())


@pytest.mark.skipif(
    os.geteuid() != 0, reason="mounting a small tmpfs needs root (unprivileged CI runs only the patched cases)"
)
def test_a_full_tmpfs_during_a_checkpoint_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, capsys):
    import subprocess

    from safetensors.torch import load_file

    probe = tmp_path / "probe"
    assert main(_hcdlm_argv(probe, steps=2)) == 0
    capsys.readouterr()
    one_run, checkpoint = _tree_bytes(probe), _tree_bytes(probe / "checkpoints" / "step_00000002")
    mount = tmp_path / "small"
    mount.mkdir()
    size = one_run + checkpoint // 2  # the first checkpoint fits, a second one beside it does not
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.decode().strip()}")
    try:
        run = mount / "run"
        assert main(_hcdlm_argv(run)) == 1
        line = _one_line(capsys)
        assert "cannot write" in line and str(run) in line, line
        assert any(word in line for word in ("No space left", "file write failed", "unexpected pos")), line
        assert (run / "checkpoints" / "latest").read_text() == "step_00000002"
        assert load_file(str(run / "checkpoints" / "step_00000002" / "weights.safetensors"))
        assert not list(run.rglob(".tmp_*")) and not (run / LOCK_NAME).exists()
    finally:
        subprocess.run(["umount", str(mount)], check=True)

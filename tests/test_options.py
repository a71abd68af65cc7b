"""Command-line flags generated from configuration dataclasses (dihal_fast.common.options)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

import pytest

from dihal_fast.cli import build_parser
from dihal_fast.common.options import (
    HelpFormatter,
    add_dataclass_options,
    comma_integers,
    dataclass_from_options,
    option,
)


@dataclass
class Inner:
    width: int = option(8, "width", flag="--w")


@dataclass
class Example:
    name: str = option("a", "which one", flag="--kind", choices=("a", "b"), required=True)
    numbers: list[int] = option(default_factory=lambda: [3, 4], help="numbers", type=comma_integers)
    files: list[str] = option(default_factory=list, help="files")
    decay: float = option(0.9, "decay", flag=("--decay", "--old-decay"))
    temperature: float = option(0.0, "temperature; the command decides when omitted", cli_default=None)
    head: bool = option(True, "a head", flag="--with-head")
    inner: Inner = field(default_factory=Inner)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    add_dataclass_options(parser, Example)
    return parser


def test_flag_type_alias_cli_default_and_required():
    parser = _parser()
    args = parser.parse_args(["--kind", "b"])
    assert (args.name, args.numbers, args.files, args.decay, args.temperature, args.head) == (
        "b",
        [3, 4],
        [],
        0.9,
        None,
        True,
    )
    assert dataclass_from_options(Example, args, temperature=1.5) == Example(name="b", temperature=1.5)
    args = parser.parse_args(
        [
            "--kind",
            "a",
            "--numbers",
            "5,6,7",
            "--files",
            "x",
            "y",
            "--old-decay",
            "0.5",
            "--no-with-head",
            "--w",
            "3",
            "--temperature",
            "2",
        ]
    )
    assert dataclass_from_options(Example, args) == Example("a", [5, 6, 7], ["x", "y"], 0.5, 2.0, False, Inner(3))
    with pytest.raises(SystemExit):
        parser.parse_args([])  # --kind is required although the field has a default
    with pytest.raises(SystemExit):
        parser.parse_args(["--kind", "a", "--numbers", "3,x"])
    assert comma_integers("") == [] and comma_integers(" 1, 2,") == [1, 2]
    help_text = parser.format_help()
    assert "--decay DECAY, --old-decay DECAY" in help_text and "--w W" in help_text
    assert "(default: a)" not in help_text  # a required flag shows no default
    with pytest.raises(ValueError, match="help text"):
        option(1)


HCDLM_TRAIN = ["hcdlm", "train", "--out", "run", "--task", "countdown"]


def test_hcdlm_train_flags_keep_their_spellings(tmp_path):
    from dihal_fast.hcdlm.config import (
        HCDLMModelConfig,
        HCDLMTrainConfig,
        ObjectiveConfig,
        RunConfig,
        SampleConfig,
        fill_task_defaults,
    )
    from dihal_fast.hcdlm.eval_config import HCDLMSolveConfig
    from dihal_fast.tasks.registry import TaskConfig

    parser = build_parser()
    args = parser.parse_args(
        [
            *HCDLM_TRAIN,
            "--model",
            "mdm",
            "--hidden",
            "32",
            "--countdown-numbers",
            "3,4,5",
            "--countdown-len",
            "12",
            "--sudoku-difficulty",
            "hard",
            "--ema",
            "0.5",
            "--checkpoint-every",
            "7",
            "--backbone",
            "tok",
            "--warmup-steps",
            "3",
            "--timesteps",
            "50",
        ]
    )
    assert (args.kind, args.hidden, args.countdown_numbers, args.countdown_target_len) == ("mdm", 32, [3, 4, 5], 12)
    assert (args.sudoku_train_difficulty, args.ema_decay, args.checkpoint_every, args.tokenizer_dir) == (
        "hard",
        0.5,
        7,
        "tok",
    )
    assert args.ema_decay == parser.parse_args([*HCDLM_TRAIN, "--ema-decay", "0.5"]).ema_decay
    args = parser.parse_args(HCDLM_TRAIN)
    assert (args.slot_head, args.tokenizer_dir, args.text_files, args.deepspeed) == (None, None, None, None)
    assert (args.latent_dim, args.latent_schedule_power, args.lr) == (None, None, None)
    fill_task_defaults(vars(args))
    assert dataclass_from_options(RunConfig, args) == RunConfig(task=TaskConfig("countdown"))
    assert isinstance(RunConfig().model, HCDLMModelConfig) and isinstance(RunConfig().train, HCDLMTrainConfig)
    assert ObjectiveConfig() == RunConfig().objective
    # an unset --temperature is the run's task default, resolved by the config (as for a config built in Python)
    args = parser.parse_args(["hcdlm", "solve", str(tmp_path), "1,2,3", "--clamp", "--steps", "4"])
    config = dataclass_from_options(HCDLMSolveConfig, args)
    assert config == HCDLMSolveConfig(
        run_dir=str(tmp_path), puzzle="1,2,3", sample=SampleConfig(steps=4, clamp=True, temperature=None)
    )
    assert config.sampling(text=True) == SampleConfig(steps=4, clamp=True, temperature=1.0)
    assert config.sampling(text=False) == SampleConfig(steps=4, clamp=True, temperature=0.0)
    assert HCDLMSolveConfig(run_dir="r", puzzle="p").sampling(text=True).temperature == 1.0
    args = parser.parse_args(["hcdlm", "solve", str(tmp_path), "1,2,3", "--raw-weights", "--temperature", "0.5"])
    config = dataclass_from_options(HCDLMSolveConfig, args)
    assert (config.sampling(text=True).temperature, config.raw_weights) == (0.5, True)


@pytest.mark.parametrize("box", ["3x3", "2x3", "2x2"])
def test_hcdlm_train_defaults_follow_the_sudoku_size(box):
    """9x9 Sudoku gets its own command-line defaults (wide latent, p = 3, lr 3e-3, 12 denoiser blocks); given flags
    win; a baseline is matched to the HC-DLM of the same command line."""
    from dihal_fast.hcdlm import HCDLMModelConfig, HCDLMTrainConfig, RunConfig, task_defaults
    from dihal_fast.hcdlm.config import fill_task_defaults
    from dihal_fast.hcdlm.layers import count_parameters
    from dihal_fast.hcdlm.models import matched_blocks
    from dihal_fast.hcdlm.networks import HCDLM
    from dihal_fast.tasks.registry import TaskConfig, build_task

    parser = build_parser()
    train = ["hcdlm", "train", "--out", "run", "--task", "sudoku", "--sudoku-box", box]
    args = parser.parse_args(train)
    fill_task_defaults(vars(args))
    config = dataclass_from_options(RunConfig, args)
    assert config == RunConfig.for_task(name="sudoku", sudoku_box=box)  # the API builds what the command line does
    nine = box == "3x3"
    expected = (256, 3.0, 3e-3, 12) if nine else (64, 1.0, 1e-3, 6)
    chosen = (
        config.model.latent_dim,
        config.model.latent_schedule_power,
        config.train.lr,
        config.model.denoiser_blocks,
    )
    assert chosen == expected
    names = ("latent_dim", "latent_schedule_power", "lr", "denoiser_blocks")
    assert task_defaults("sudoku", box) == dict(zip(names, expected))
    assert config == RunConfig(
        task=TaskConfig("sudoku", sudoku_box=box),
        model=HCDLMModelConfig(latent_dim=expected[0], latent_schedule_power=expected[1], denoiser_blocks=expected[3]),
        train=HCDLMTrainConfig(lr=expected[2]),
    )
    flags = ["--latent-dim", "32", "--latent-schedule-power", "2", "--lr", "0.01", "--denoiser-blocks", "3"]
    given = parser.parse_args([*train, *flags])
    fill_task_defaults(vars(given))
    mine = dataclass_from_options(RunConfig, given)
    assert (
        mine.model.latent_dim,
        mine.model.latent_schedule_power,
        mine.train.lr,
        mine.model.denoiser_blocks,
    ) == (32, 2.0, 0.01, 3)
    mdm = parser.parse_args([*train, "--model", "mdm"])
    fill_task_defaults(vars(mdm))
    baseline = dataclass_from_options(RunConfig, mdm).model
    spec = build_task(config.task, for_training=False).spec
    wider = count_parameters(HCDLM(spec, config.model))
    assert baseline.latent_dim == config.model.latent_dim
    assert matched_blocks(spec, baseline, "mdm") == matched_blocks(spec, config.model, "mdm")
    assert (wider > count_parameters(HCDLM(spec, HCDLMModelConfig()))) == nine


def test_saved_configs_with_the_old_names_load():
    from dihal_fast.hcdlm.config import RunConfig
    from dihal_fast.replace.config import BridgeTrainConfig

    saved = RunConfig().to_dict()
    saved["train"]["ema"] = 0.9
    del saved["train"]["ema_decay"]
    assert RunConfig.from_dict(json.loads(json.dumps(saved))).train.ema_decay == 0.9
    saved = BridgeTrainConfig().to_dict()
    saved["save_every"] = saved.pop("checkpoint_every") + 1
    assert BridgeTrainConfig.from_dict(saved) == BridgeTrainConfig(checkpoint_every=101)
    args = build_parser().parse_args(["replace", "--layer", "1", "--out", "run", "--save-every", "9"])
    assert args.checkpoint_every == 9


def test_backbone_train_flags_keep_their_spellings():
    from dihal_fast.backbone import default_model_dir
    from dihal_fast.backbone.config import BackboneModelConfig, BackboneTrainConfig

    parser = build_parser()
    args = parser.parse_args(
        [
            "backbone",
            "train",
            "--corpus",
            "a.txt",
            "--out",
            "o",
            "--layers",
            "2",
            "--hidden",
            "32",
            "--heads",
            "2",
            "--intermediate",
            "64",
            "--seq-len",
            "16",
            "--checkpoint-every",
            "5",
            "--deepspeed",
            "ds.json",
        ]
    )
    model = BackboneModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seq_len=16)
    assert dataclass_from_options(BackboneTrainConfig, args) == BackboneTrainConfig(
        corpus=["a.txt"], model=model, checkpoint_every=5
    )
    assert args.deepspeed == "ds.json"
    with pytest.raises(SystemExit):
        parser.parse_args(["backbone", "train", "--out", "o"])  # --corpus stays required
    shipped = json.loads((default_model_dir() / "train_config.json").read_text())
    assert BackboneTrainConfig.from_dict(shipped).checkpoint_every == shipped["checkpoint_every"]


@pytest.mark.parametrize("command", [["hcdlm", "train"], ["hcdlm", "eval"], ["hcdlm", "solve"], ["backbone", "train"]])
def test_every_option_is_explained(command):
    parser = build_parser()
    sub = parser
    for name in command:
        sub = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    assert all(action.help for action in sub._actions), [a.dest for a in sub._actions if not a.help]

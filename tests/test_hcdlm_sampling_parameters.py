"""Sampling parameters (the parameters a chain reads when it samples, the count the paper matches models on):
hand-counted on a small config, checked against the modules a chain really runs, the baseline shape matched on them,
and both counts in the train report and the protocol's rows."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from dihal_fast.hcdlm.config import HCDLMModelConfig, RunConfig, SampleConfig
from dihal_fast.hcdlm.layers import count_parameters
from dihal_fast.hcdlm.models import (
    COMMON_WIDTH,
    KINDS,
    PassCounter,
    build_model,
    generate,
    matched_blocks,
    matched_shape,
    parameter_match,
    sampling_parameters,
)
from dihal_fast.hcdlm.noise import make_kernel
from dihal_fast.hcdlm.trainer import train
from dihal_fast.tasks.base import TaskSpec
from dihal_fast.tasks.sudoku_task import SudokuTask
from dihal_fast.testing.tiny import HCDLM_TINY, hcdlm_tiny_config

# A task of 2 slots over 3 tokens, no context; width 8, one latent of size 2, one block in every stack.
TOY = TaskSpec(name="toy", target_vocab=3, target_len=2)
TOY_MODEL = {"hidden": 8, "heads": 2, "latent_dim": 2, "baseline_blocks": 1, "denoiser_blocks": 1}


def linear(fan_in: int, fan_out: int) -> int:
    return fan_in * fan_out + fan_out


H, D, L, V, RANK = 8, 2, 2, 3, 16  # width, latent size, slots, tokens, the read-outs' features per slot
NORM = 2 * H  # an affine LayerNorm
CORE = linear(H, 3 * H) + linear(H, H) + linear(H, 4 * H) + linear(4 * H, H)  # attention + MLP: 840
BLOCK = CORE + 2 * NORM  # 872
ADALN_BLOCK = CORE + linear(H, 6 * H)  # norms without affine, modulation from a width-8 vector: 1272
TIME = linear(64, H) + linear(H, H)  # 592
SLOTS = (V + 1) * H + L * H  # token table ([MASK] included) + free positions: 48
HEAD = NORM + linear(H, V)  # 43
ENCODER = SLOTS + BLOCK + NORM + linear(H, RANK) + linear(L * RANK, 2 * D)  # 1212
DENOISER = linear(D, H) + H + SLOTS + TIME + ADALN_BLOCK + NORM + linear(H, D) + NORM + linear(H, RANK)
DENOISER += linear(L * RANK, D)  # 2204, without the training-only slot head
SLOT_HEAD = HEAD  # 43
PREDICTOR = linear(D, L * RANK) + linear(RANK, H) + linear(D, H) + H + L * H + BLOCK + HEAD  # 1195

HAND_COUNTED = {  # kind: (all parameters, sampling parameters)
    "hcdlm": (ENCODER + DENOISER + SLOT_HEAD + PREDICTOR, DENOISER + PREDICTOR),
    "latent": (ENCODER + DENOISER + SLOT_HEAD + PREDICTOR - (V + 1) * H, DENOISER + PREDICTOR - (V + 1) * H),
    "mdm": (SLOTS + BLOCK + HEAD,) * 2,
    "ccdd": (SLOTS + linear(D, H) + TIME + ADALN_BLOCK + NORM + linear(H, V) + linear(H, D),) * 2,
    "ar": (1 * H + (V + 1) * H + L * H + BLOCK + HEAD,) * 2,  # AR's context table has one row without context
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_sampling_parameters_are_hand_counted_on_a_small_config(kind):
    model = build_model(TOY, HCDLMModelConfig(kind=kind, **TOY_MODEL))
    assert (count_parameters(model), sampling_parameters(model)) == HAND_COUNTED[kind]
    assert HAND_COUNTED["hcdlm"] == (4654, 3399) and HAND_COUNTED["mdm"] == (963, 963)  # the sums, written out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_sampling_parameters_are_those_of_the_modules_a_chain_runs(kind):
    task = SudokuTask(2, 2)
    torch.manual_seed(0)
    model = build_model(task.spec, HCDLMModelConfig(kind=kind, baseline_blocks=2, **HCDLM_TINY)).eval()
    ran: set[nn.Module] = set()
    handles = [module.register_forward_hook(lambda m, *_: ran.add(m)) for module in model.modules()]
    context = torch.zeros(3, task.spec.context_len, dtype=torch.long)
    generate(model, make_kernel("uniform", task.spec.target_vocab), context, SampleConfig(steps=3))
    for handle in handles:
        handle.remove()
    read = sum(p.numel() for module in ran for p in module.parameters(recurse=False))
    assert read == sampling_parameters(model)
    assert (read < count_parameters(model)) == KINDS[kind].latent  # HC-DLM and Latent DM never run their encoder


def test_the_train_report_states_both_counts_beside_the_hcdlm_of_the_same_fields(tmp_path):
    report = train(hcdlm_tiny_config(2), tmp_path / "run")
    model = build_model(SudokuTask(2, 2).spec, hcdlm_tiny_config().model)
    assert report["parameters"] == report["hcdlm_parameters"] == count_parameters(model)
    assert report["sampling_parameters"] == report["hcdlm_sampling_parameters"] == sampling_parameters(model)
    assert report["sampling_parameters"] < report["parameters"] and report["sampling_ratio"] == 1.0


def test_a_baseline_at_the_hcdlm_total_samples_with_more_parameters_than_it():
    spec, cfg = SudokuTask(3, 3).spec, RunConfig.for_task(name="sudoku", sudoku_box="3x3").model
    for kind, blocks in {"mdm": 48, "ccdd": 32, "ar": 48}.items():  # the 9x9 records' matched shapes, unchanged
        assert matched_blocks(spec, cfg, kind) == blocks
        match = parameter_match(spec, replace(cfg, kind=kind))
        assert match["matched"] and match["sampling_ratio"] > 1.4  # HC-DLM's 0.72 M encoder parameters


@pytest.mark.parametrize("kind", ["mdm", "ccdd", "ar", "latent"])
def test_matched_shape_is_the_closest_sampling_count_over_widths_and_blocks(kind):
    spec, cfg = SudokuTask(2, 2).spec, HCDLMModelConfig(kind=kind, **HCDLM_TINY)
    target = sampling_parameters(build_model(spec, replace(cfg, kind="hcdlm")))
    found = matched_shape(spec, cfg, (16, 32))
    field = "denoiser_blocks" if kind == "latent" else "baseline_blocks"
    assert set(found) == {"hidden", field}

    def gap(width: int, blocks: int) -> int:
        return abs(sampling_parameters(build_model(spec, replace(cfg, hidden=width, **{field: blocks}))) - target)

    best = min(gap(width, blocks) for width in (16, 32) for blocks in range(1, 25))
    assert gap(found["hidden"], found[field]) == best
    assert matched_shape(spec, cfg, (32,), target=10**6)[field] > 50  # any target, not only the HC-DLM's
    with pytest.raises(ValueError, match="multiple of heads"):
        matched_shape(spec, cfg, (33,))


def test_hcdlm_matched_to_itself_keeps_its_shape():
    spec, cfg = SudokuTask(2, 2).spec, HCDLMModelConfig(**{**HCDLM_TINY, "denoiser_blocks": 3})
    assert matched_shape(spec, cfg) == {"hidden": 32, "denoiser_blocks": 3}


@pytest.mark.parametrize("hidden", [32, 128])
def test_block_passes_at_the_common_width_weigh_each_block_by_its_width_squared(hidden):
    task = SudokuTask(2, 2)
    model = build_model(task.spec, HCDLMModelConfig(kind="mdm", hidden=hidden, heads=2, baseline_blocks=2)).eval()
    with PassCounter(model) as cost:
        generate(model, None, torch.zeros(3, task.spec.context_len, dtype=torch.long), SampleConfig(steps=4))
    assert cost.block_passes == 3 * 4 * 2
    assert cost.width64_block_passes == cost.block_passes * (hidden / COMMON_WIDTH) ** 2
    assert cost.figures() == {"passes": 12, "block_passes": 24, "width64_block_passes": cost.width64_block_passes}

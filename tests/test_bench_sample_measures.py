"""The sample measures of the real-model text benches: copy candidates, per-sample distinct-4 and the intervals of
their differences, against brute-force references; their options refused in one line before any work."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_real_decoding as decoding  # noqa: E402 (from bench/, put on sys.path above)
import bench_real_repetition as repetition  # noqa: E402


def _reference_candidates(sequence: list[int]) -> list[int]:
    """For each t, scan all earlier bigram occurrences and take the latest one's follower."""
    out = []
    for t in range(len(sequence)):
        found = -1
        for j in range(2, t):
            if (sequence[j - 2], sequence[j - 1]) == (sequence[t - 2], sequence[t - 1]):
                found = sequence[j]
        out.append(found if t >= 2 else -1)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40))
def test_copy_candidates_match_a_brute_force_scan(sequence):
    assert repetition.copy_candidates(sequence) == _reference_candidates(sequence)


def test_a_loop_predicts_its_own_continuation():
    loop = [5, 6, 7] * 4
    candidates = repetition.copy_candidates(loop)
    assert candidates[:5] == [-1] * 5 and candidates[5:] == loop[5:]


def test_copy_probability_difference_is_the_pooled_mean_with_an_interval_around_it():
    rng = np.random.default_rng(1)
    base = [{"p_copy": rng.random(n)} for n in (3, 7, 1, 12, 5)]
    own = [{"p_copy": b["p_copy"] + 0.1} for b in base]
    point, low, high = repetition.difference_interval(own, base)
    assert point == pytest.approx(0.1) and low == pytest.approx(0.1) and high == pytest.approx(0.1)
    noisy = [{"p_copy": b["p_copy"] + rng.normal(0, 0.05, b["p_copy"].size)} for b in base]
    point, low, high = repetition.difference_interval(noisy, base)
    pooled = np.concatenate([n["p_copy"] - b["p_copy"] for n, b in zip(noisy, base)]).mean()
    assert point == pytest.approx(pooled) and low < point < high


class _CharTokenizer:
    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}


def test_per_sample_distinct_is_each_samples_own_unique_share_of_4_grams():
    measured = decoding.per_sample_distinct(["abcdefg", "abababab", "abc"], _CharTokenizer())
    assert measured.tolist() == pytest.approx([1.0, 2 / 5])  # the 3-character sample holds no 4-gram


def test_sample_difference_interval_contains_the_difference_of_means():
    rng = np.random.default_rng(0)
    hybrid, backbone = rng.random(64) * 0.5, rng.random(64)
    point, low, high = decoding.difference_interval(hybrid, backbone)
    assert point == pytest.approx(hybrid.mean() - backbone.mean()) and low < point < high < 0


@pytest.mark.parametrize("text", ["no-separator", "=somewhere", "label=/definitely/not/here"])
def test_run_options_are_refused_in_one_line(text):
    with pytest.raises(SystemExit, match="expected LABEL=DIR"):
        decoding.extra_run(text)
    with pytest.raises(SystemExit, match="expected LABEL=DIR"):
        repetition.hybrid_option(text)

"""What ``dihal hcdlm eval`` and ``dihal hcdlm solve`` are asked, as configs (their flags are generated from these,
:mod:`dihal_fast.common.options`): the run and how it samples (:class:`ReadoutConfig`), then the data and the
diagnostics of an evaluation (:class:`HCDLMEvalConfig`) or the one puzzle to solve (:class:`HCDLMSolveConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from dihal_fast.common.devices import device_option
from dihal_fast.common.options import comma_floats, comma_integers, option
from dihal_fast.common.validation import CheckedConfig
from dihal_fast.errors import DihalValueError
from dihal_fast.hcdlm.config import SampleConfig
from dihal_fast.hcdlm.mechanism import ABLATION_LEVELS

STEPS_SWEEP = (5, 10, 25, 50)  # sampling step counts of the accuracy-vs-steps curve
TEXT_TEMPERATURE = 1.0  # text samples are drawn (argmax text repeats itself)
PUZZLE_TEMPERATURE = 0.0  # a puzzle's answer is the argmax


@dataclass
class ReadoutConfig(CheckedConfig):
    """A trained run, the weights that answer and how they sample; ``sample`` None, or its temperature None: the
    run's task decides the temperature (1 for text, argmax for puzzles; :meth:`sampling`)."""

    run_dir: str = option(help="run directory written by 'dihal hcdlm train'", positional=True)
    sample: SampleConfig | None = option(None, "sampling settings (None: the task's defaults)")
    seed: int = option(0, "sampling seed")
    raw_weights: bool = option(False, "use the raw weights instead of the EMA")
    device: str = device_option()

    def sampling(self, text: bool) -> SampleConfig:
        """``sample`` (the defaults when None) with an unset temperature resolved to the task's default:
        :data:`TEXT_TEMPERATURE` for text, :data:`PUZZLE_TEMPERATURE` (argmax) for puzzles."""
        sample = self.sample if self.sample is not None else SampleConfig(temperature=None)
        if sample.temperature is not None:
            return sample
        return replace(sample, temperature=TEXT_TEMPERATURE if text else PUZZLE_TEMPERATURE)


@dataclass(kw_only=True)
class HCDLMEvalConfig(ReadoutConfig):
    """An evaluation of a run on a data file, with the accuracy-vs-steps curve and the mechanism diagnostics."""

    data: str = option(help="evaluation file (Sudoku CSV, Countdown JSONL or a .txt file for text)")
    limit: int | None = option(None, "evaluate only the first N records", min=1)
    steps_sweep: list[int] = option(
        default_factory=lambda: list(STEPS_SWEEP),
        help="step counts for the accuracy-vs-steps plot, comma-separated (empty = none)",
        type=comma_integers,
        min=1,
    )
    samples: int = option(64, "text: number of samples to score", min=1)
    evaluator: str | None = option(None, "text: evaluator LM for Gen PPL (default: the shipped backbone)")
    diagnostics: bool = option(
        True,
        "the raw-vs-EMA comparison, the read-out after every sampling step, the in-sampler interventions (latent "
        "reset to the prior, another puzzle's latent, the latent re-encoded from the current tokens, the scaffold "
        "reset) and the oracle input ablations",
    )
    compare: str | None = option(
        None,
        "another run on the same task (e.g. MDM): its accuracy against steps and its decoded answer per normalised "
        "step beside this run's, same puzzles",
        metavar="RUN",
    )
    noise_levels: list[float] = option(
        default_factory=lambda: list(ABLATION_LEVELS),
        help="Sudoku, latent models: noise levels in (0, 1] of the ablations (x_t -> noise, scaffold -> true / "
        "random tokens), comma-separated (empty = none)",
        type=comma_floats,
        gt=0.0,
        max=1.0,
    )
    protocol_k: int = option(
        0,
        "the evaluation protocol (puzzles): single chain, best-of-K and oracle@K side by side with their cost in "
        "forward passes, the step count, diversity source and verifier chosen on --validation first (0 = off)",
        min=0,
    )
    validation: str | None = option(
        None, "with --protocol-k: the validation file the protocol's settings are chosen on", metavar="FILE"
    )
    steps_choices: list[int] = option(
        default_factory=list,
        help="with --protocol-k: the single chain's candidate step counts, comma-separated (empty = --steps)",
        type=comma_integers,
        min=1,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.protocol_k == 1:
            raise DihalValueError("--protocol-k compares best-of-K with one chain: give K >= 2 (or 0 for off)")
        if self.protocol_k and self.validation is None:
            raise DihalValueError("--protocol-k chooses its settings on a validation set: give --validation FILE")


@dataclass(kw_only=True)
class HCDLMSolveConfig(ReadoutConfig):
    """One puzzle for a trained run: a Sudoku grid ('.' or 0 for blanks) or a Countdown 'n1,n2,...,target'."""

    puzzle: str = option(help="the puzzle text", positional=True)

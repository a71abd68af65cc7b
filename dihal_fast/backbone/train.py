"""The backbone as a :class:`~dihal_fast.train.trainer.TrainingJob`: corpus, tokenizer, next-token loss,
periodic validation and the ``from_pretrained`` export; the loop, AdamW, warm-up + cosine LR, clipping,
checkpoints, exact resume and DeepSpeed are the shared ones of :mod:`dihal_fast.train`.

Run directory layout (``--out``)::

    config.json, model.safetensors, tokenizer*.json   the model (``from_pretrained`` layout, float32)
    train_config.json                                  the BackboneTrainConfig of the run
    log.jsonl, training_curve.png                      per-step loss / LR, periodic validation loss
    training_report.json                               final per-split PPL vs unigram / bigram baselines
    checkpoints/                                       the shared checkpoint layout (dihal_fast.train.checkpoint)
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dihal_fast.backbone.config import BackboneTrainConfig
from dihal_fast.backbone.corpus import default_valid_files, read_text_file, sha256_file, split_tail
from dihal_fast.backbone.data import WindowSampler
from dihal_fast.backbone.model import autocast_context, build_model, resolve_precision
from dihal_fast.backbone.perplexity import stream_nll
from dihal_fast.common import atomic_write_bytes, atomic_write_json, read_json, seed_everything
from dihal_fast.common.deepspeed_banner import without_deepspeed_banner
from dihal_fast.common.io import append_line, write_into
from dihal_fast.common.reports import StageReport
from dihal_fast.errors import DihalValueError
from dihal_fast.train.checkpoint import latest_checkpoint
from dihal_fast.train.trainer import TrainingJob, TrainingRun, fit, prepare_deepspeed, resume_point, training_session

logger = logging.getLogger(__name__)

MODEL_MARKERS = ("config.json", "model.safetensors", "tokenizer.json", "train_config.json")
LEGACY_RESUME_DIR = "resume"  # the checkpoint folder before the shared training loop
CONFIG_NAME = "train_config.json"


@dataclass
class Corpus:
    """Training documents, held-out splits and the provenance of every file."""

    train_texts: list[str] = field(default_factory=list)
    valid_texts: dict[str, str] = field(default_factory=dict)
    files: list[dict] = field(default_factory=list)


def split_name(path: Path) -> str:
    """``tinystories.valid.txt`` -> ``tinystories``."""
    name = path.name
    for suffix in (".valid.txt", ".train.txt", ".txt"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def load_corpus(cfg: BackboneTrainConfig) -> Corpus:
    """Read and check every file; held-out splits are the ``valid`` files or the tail of each corpus file."""
    corpus = Corpus()
    train_paths = [Path(p) for p in cfg.corpus]
    valid_paths = [Path(p) for p in cfg.valid]
    for path in train_paths:
        text = read_text_file(path)
        if not valid_paths:
            text, corpus.valid_texts[split_name(path)] = split_tail(text, cfg.valid_fraction)
        corpus.train_texts.append(text)
        corpus.files.append(
            _provenance(path, "train" if valid_paths else f"train (last {cfg.valid_fraction:.0%} held out)")
        )
    for path in valid_paths:
        corpus.valid_texts[split_name(path)] = read_text_file(path)
        corpus.files.append(_provenance(path, "valid"))
    return corpus


def _provenance(path: Path, role: str) -> dict:
    return {"path": str(path), "role": role, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def resolve_valid(cfg: BackboneTrainConfig) -> None:
    """Fill ``cfg.valid`` with the sibling ``*.valid.txt`` files when none were given and all exist."""
    if not cfg.valid:
        cfg.valid = [str(p) for p in default_valid_files([Path(p) for p in cfg.corpus]) or []]


def check_out_dir(out: Path, cfg: BackboneTrainConfig, resume: bool) -> tuple[bool, int | None]:
    """Refuse to overwrite a different model in ``out``.

    Returns (whether there is a checkpoint to resume from, the saved ``steps`` when ``--resume`` asks
    for a different total: the only option a resumed run may change; the cosine is re-planned from
    the current step).
    """
    held = [name for name in MODEL_MARKERS if (out / name).exists()]
    if held and not resume:
        raise DihalValueError(
            f"output directory {out} already holds a model ({', '.join(held)}); pass --resume to continue "
            "that run, or choose an empty --out (nothing was overwritten)"
        )
    saved_steps = None
    if resume and (out / "train_config.json").exists():
        saved = BackboneTrainConfig.from_dict(read_json(out / "train_config.json", "training config"))
        diffs = cfg.differences(saved.to_dict(), ignore=("steps",))
        if diffs:
            raise DihalValueError(
                f"--resume: {out} holds a different run ({'; '.join(diffs)}); "
                "use the same options (only --steps may change) or another --out"
            )
        saved_steps = saved.steps if saved.steps != cfg.steps else None
    elif resume and held:
        raise DihalValueError(
            f"--resume: {out} holds a model ({', '.join(held)}) but no train_config.json; not a backbone run"
        )
    if resume and (out / LEGACY_RESUME_DIR / "trainer_state.pt").exists():
        raise DihalValueError(
            f"--resume: {out} was checkpointed by an earlier dihal_fast ({LEGACY_RESUME_DIR}/trainer_state.pt); "
            "this version cannot continue it: train again into a new --out"
        )
    return resume and latest_checkpoint(out) is not None, saved_steps


def encode_corpus(out: Path, tokenizer, corpus: Corpus) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Token streams of the corpus, cached in ``out/tokens.npz`` keyed by the tokenizer and file hashes."""
    from dihal_fast.backbone.tokenizer import encode_documents

    key = json.dumps(
        [sha256_file(out / "tokenizer.json"), [f["sha256"] for f in corpus.files], sorted(corpus.valid_texts)]
    )
    cache = out / "tokens.npz"
    if cache.exists():
        with np.load(cache) as data:
            if str(data["key"]) == key:
                return data["train"], {name: data[f"valid/{name}"] for name in corpus.valid_texts}
    train_ids = encode_documents(tokenizer, corpus.train_texts)
    valid_ids = {name: encode_documents(tokenizer, [text]) for name, text in corpus.valid_texts.items()}
    buffer = io.BytesIO()
    np.savez(buffer, key=np.array(key), train=train_ids, **{f"valid/{k}": v for k, v in valid_ids.items()})
    atomic_write_bytes(cache, buffer.getvalue())
    return train_ids, valid_ids


class NextTokenObjective(nn.Module):
    """Mean next-token cross-entropy of a causal LM (under autocast at the run's precision)."""

    def __init__(self, model: nn.Module, precision: str, device: str):
        super().__init__()
        self.model, self.precision, self.device = model, precision, device

    def forward(self, batch: torch.Tensor) -> dict:
        with autocast_context(self.precision, self.device):
            logits = self.model(input_ids=batch[:, :-1]).logits
        return {"loss": torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())}


class BackboneJob(TrainingJob):
    """Windows of the token stream per step, validation every ``eval_every`` steps, the model exported at
    checkpoints."""

    resumable = frozenset({"steps"})  # check_out_dir compared the rest (nested model fields included)

    def __init__(
        self,
        cfg: BackboneTrainConfig,
        model: nn.Module,
        tokenizer,
        train_ids: np.ndarray,
        valid_ids: dict[str, np.ndarray],
        out: Path,
        precision: str,
        device: str,
        end: int,
    ):
        self.cfg, self.model, self.tokenizer, self.valid_ids, self.out, self.precision = (
            cfg,
            model,
            tokenizer,
            valid_ids,
            out,
            precision,
        )
        self.objective = NextTokenObjective(model, precision, device)
        self.settings = cfg.loop_settings(device)
        self.configs = {CONFIG_NAME: cfg.to_dict()}
        self.name, self.end = "backbone", end
        self.sampler = WindowSampler(train_ids, cfg.model.seq_len, cfg.batch_size, cfg.seed)
        self.window_start, self.window_tokens = time.perf_counter(), 0

    def batch(self, step: int, engine) -> dict:
        batch = self.sampler.batch(step).to(engine.device)
        self.window_tokens += batch[:, 1:].numel()
        return {"batch": batch}

    def after_step(self, step: int, values: dict[str, float], run: TrainingRun) -> dict:
        if step % self.settings.log_every and step != self.end:
            return {}
        now = time.perf_counter()
        extra = {
            "epoch": self.sampler.epoch_of(step * self.settings.grad_accum_steps),
            "tokens_per_s": self.window_tokens / (now - self.window_start),
        }
        self.window_start, self.window_tokens = now, 0
        return extra

    def step_done(self, step: int, run: TrainingRun) -> None:
        if (step % self.cfg.eval_every == 0 or step == self.end) and run.log is not None:
            val = {name: _mean_nll(self.model, ids, self.cfg, self.precision) for name, ids in self.valid_ids.items()}
            run.log.append({"step": step, "val_loss": val, "elapsed_s": run.elapsed_s})
            logger.info(
                "step %d: train loss %.3f, val loss %s",
                step,
                run.values["loss"],
                {k: round(v, 3) for k, v in val.items()},
            )

    def on_checkpoint(self, step: int, run: TrainingRun) -> None:
        if run.engine.rank == 0:
            with without_deepspeed_banner():
                write_into(self.out, self.model.save_pretrained)


def train_backbone(
    cfg: BackboneTrainConfig,
    out: str | Path,
    resume: bool = False,
    stop_at: int | None = None,
    device: str = "cpu",
    command: str = "",
    progress: bool = True,
    deepspeed_config: str | os.PathLike | None = None,
) -> StageReport:
    """Train (or continue) a backbone run in ``out``; returns the training report of the finished segment
    (``out/training_report.json``).

    ``stop_at`` ends this invocation after that many optimizer steps (as if interrupted, with a
    checkpoint); the LR schedule always follows ``cfg.steps``. With ``deepspeed_config`` the DeepSpeed
    ZeRO engine trains (launch several processes with torchrun).
    """
    from transformers import PreTrainedTokenizerFast

    from dihal_fast.backbone.report import write_training_report
    from dihal_fast.backbone.tokenizer import train_tokenizer

    out = Path(out)
    resolve_valid(cfg)
    cfg.validate()
    if stop_at is not None and stop_at < 1:
        raise DihalValueError(f"--stop-at must be >= 1, got {stop_at}")
    corpus = load_corpus(cfg)
    has_checkpoint, saved_steps = check_out_dir(out, cfg, resume)
    settings = cfg.loop_settings(device)
    ds_config, world = prepare_deepspeed(deepspeed_config, settings)
    checkpoint = None
    if has_checkpoint:
        checkpoint = resume_point(
            out, {CONFIG_NAME: cfg}, BackboneJob.resumable, cfg.steps, ds_config, world, resume=True
        )
    with training_session(ds_config, settings) as (rank, _, device):
        out.mkdir(parents=True, exist_ok=True)
        precision = resolve_precision(cfg.precision, device)
        seed_everything(cfg.seed)
        if (out / "tokenizer.json").exists() and resume:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(str(out))
        elif cfg.tokenizer:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(cfg.tokenizer)
            logger.info("reusing the tokenizer of %s (%d tokens)", cfg.tokenizer, len(tokenizer))
            if rank == 0:
                write_into(out, tokenizer.save_pretrained)
                atomic_write_json(out / CONFIG_NAME, cfg.to_dict())
        else:
            logger.info(
                "training a byte-level BPE tokenizer (vocab %d) on %d documents",
                cfg.model.vocab_size,
                len(corpus.train_texts),
            )
            tokenizer = train_tokenizer(corpus.train_texts, cfg.model.vocab_size)
            if rank == 0:
                write_into(out, tokenizer.save_pretrained)
                atomic_write_json(out / CONFIG_NAME, cfg.to_dict())
        train_ids, valid_ids = encode_corpus(out, tokenizer, corpus)
        logger.info("tokens: train %d, valid %s", len(train_ids), {k: len(v) for k, v in valid_ids.items()})
        model = build_model(cfg.model, tokenizer).to(device)
        end = cfg.steps if stop_at is None else min(cfg.steps, stop_at)
        job = BackboneJob(cfg, model, tokenizer, train_ids, valid_ids, out, precision, device, end)
        if saved_steps is not None and rank == 0:
            logger.warning(
                "--steps changed from %d to %d: the cosine schedule is re-planned from the last checkpoint",
                saved_steps,
                cfg.steps,
            )
            append_line(
                out / "log.jsonl",
                json.dumps(
                    {
                        "step": json.loads((checkpoint / "state.json").read_text())["step"],
                        "event": f"steps changed from {saved_steps} to {cfg.steps}",
                    }
                ),
            )
            atomic_write_json(out / CONFIG_NAME, cfg.to_dict())
        run = fit(job, out, ds_config, checkpoint, stop_at=stop_at, progress=progress)
        report = write_training_report(
            out, model, tokenizer, cfg, corpus, train_ids, valid_ids, run.step, run.elapsed_s, precision, command
        )
        return StageReport(out, report)


def _mean_nll(model, ids: np.ndarray, cfg: BackboneTrainConfig, precision: str) -> float:
    nll, count = stream_nll(model, ids, cfg.model.seq_len, max_windows=cfg.eval_windows, precision=precision)
    return nll / count

"""Training loop of the backbone: AdamW, warmup + cosine LR, gradient clipping, checkpoints and exact resume.

Run directory layout (``--out``)::

    config.json, model.safetensors, tokenizer*.json   the model (``from_pretrained`` layout, float32)
    train_config.json                                  the TrainConfig of the run
    training_log.jsonl, training_curve.png             per-step loss / LR, periodic validation loss
    training_report.json                               final per-split PPL vs unigram / bigram baselines
    resume/                                            model + optimizer + scheduler + RNG + step
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dihal_fast.backbone.config import TrainConfig
from dihal_fast.backbone.corpus import default_valid_files, read_text_file, sha256_file, split_tail
from dihal_fast.backbone.data import WindowSampler
from dihal_fast.backbone.evaluate import autocast_context, stream_nll
from dihal_fast.backbone.model import build_model, resolve_precision
from dihal_fast.common import atomic_write_json, read_json, seed_everything

logger = logging.getLogger(__name__)

MODEL_MARKERS = ("config.json", "model.safetensors", "tokenizer.json", "train_config.json")
RESUME_DIR = "resume"
LOG_EVERY = 10


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


def load_corpus(cfg: TrainConfig) -> Corpus:
    """Read and check every file; held-out splits are the ``valid`` files or the tail of each corpus file."""
    corpus = Corpus()
    train_paths = [Path(p) for p in cfg.corpus]
    valid_paths = [Path(p) for p in cfg.valid]
    for path in train_paths:
        text = read_text_file(path)
        if not valid_paths:
            text, corpus.valid_texts[split_name(path)] = split_tail(text, cfg.valid_fraction)
        corpus.train_texts.append(text)
        corpus.files.append(_provenance(path, "train" if valid_paths else f"train (last {cfg.valid_fraction:.0%} held out)"))
    for path in valid_paths:
        corpus.valid_texts[split_name(path)] = read_text_file(path)
        corpus.files.append(_provenance(path, "valid"))
    return corpus


def _provenance(path: Path, role: str) -> dict:
    return {"path": str(path), "role": role, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def resolve_valid(cfg: TrainConfig) -> None:
    """Fill ``cfg.valid`` with the sibling ``*.valid.txt`` files when none were given and all exist."""
    if not cfg.valid:
        cfg.valid = [str(p) for p in default_valid_files([Path(p) for p in cfg.corpus]) or []]


def check_out_dir(out: Path, cfg: TrainConfig, resume: bool) -> tuple[bool, int | None]:
    """Refuse to overwrite a different model in ``out``.

    Returns (whether there is a checkpoint to resume from, the saved ``steps`` when ``--resume`` asks
    for a different total: the only option a resumed run may change; the cosine is re-planned from
    the current step).
    """
    held = [name for name in MODEL_MARKERS if (out / name).exists()]
    if held and not resume:
        raise ValueError(
            f"output directory {out} already holds a model ({', '.join(held)}); pass --resume to continue "
            "that run, or choose an empty --out (nothing was overwritten)"
        )
    saved_steps = None
    if resume and (out / "train_config.json").exists():
        saved = TrainConfig.from_dict(read_json(out / "train_config.json", "training config"))
        diffs = saved.differences(cfg, ignore=("steps",))
        if diffs:
            raise ValueError(
                f"--resume: {out} holds a different run (saved != requested: {'; '.join(diffs)}); "
                "use the same options (only --steps may change) or another --out"
            )
        saved_steps = saved.steps if saved.steps != cfg.steps else None
    elif resume and held:
        raise ValueError(f"--resume: {out} holds a model ({', '.join(held)}) but no train_config.json; not a backbone run")
    return resume and (out / RESUME_DIR / "trainer_state.pt").exists(), saved_steps


def encode_corpus(out: Path, tokenizer, corpus: Corpus) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Token streams of the corpus, cached in ``out/tokens.npz`` keyed by the tokenizer and file hashes."""
    from dihal_fast.backbone.tokenizer import encode_documents

    key = json.dumps([sha256_file(out / "tokenizer.json"), [f["sha256"] for f in corpus.files], sorted(corpus.valid_texts)])
    cache = out / "tokens.npz"
    if cache.exists():
        with np.load(cache) as data:
            if str(data["key"]) == key:
                return data["train"], {name: data[f"valid/{name}"] for name in corpus.valid_texts}
    train_ids = encode_documents(tokenizer, corpus.train_texts)
    valid_ids = {name: encode_documents(tokenizer, [text]) for name, text in corpus.valid_texts.items()}
    tmp = out / "tokens.tmp.npz"
    np.savez(tmp, key=np.array(key), train=train_ids, **{f"valid/{k}": v for k, v in valid_ids.items()})
    os.replace(tmp, cache)
    return train_ids, valid_ids


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to 1, then cosine decay to ``min_lr_ratio`` at ``cfg.steps``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices (embeddings included), none on norm gains."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def save_checkpoint(out: Path, model, optimizer, scheduler, step: int, elapsed_s: float) -> None:
    """Write ``out/resume`` atomically (a new directory renamed over the old one)."""
    from safetensors.torch import save_model

    tmp, final, old = out / f"{RESUME_DIR}.tmp", out / RESUME_DIR, out / f"{RESUME_DIR}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    state = {
        "step": step,
        "elapsed_s": elapsed_s,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
    }
    torch.save(state, tmp / "trainer_state.pt")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(out: Path, model, optimizer, scheduler) -> tuple[int, float]:
    """Restore model, optimizer, scheduler and RNG from ``out/resume``; returns (step, elapsed seconds)."""
    from safetensors.torch import load_model

    folder = out / RESUME_DIR
    load_model(model, str(folder / "model.safetensors"))
    state = torch.load(folder / "trainer_state.pt", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return int(state["step"]), float(state["elapsed_s"])


def truncate_log(path: Path, step: int) -> None:
    """Drop log records after ``step`` (written by an interrupted run past its last checkpoint)."""
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in keep))


@contextmanager
def sigterm_as_interrupt():
    """Turn SIGTERM (e.g. ``kill PID``) into KeyboardInterrupt so the loop can checkpoint before exiting."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def train_backbone(
    cfg: TrainConfig, out: str | Path, resume: bool = False, stop_at: int | None = None,
    device: str = "cpu", command: str = "", progress: bool = True,
) -> dict:
    """Train (or continue) a backbone run in ``out``; returns the training report of the finished segment.

    ``stop_at`` ends this invocation after that many optimizer steps (as if interrupted, with a
    checkpoint); the LR schedule always follows ``cfg.steps``.
    """
    from transformers import PreTrainedTokenizerFast

    from dihal_fast.backbone.report import write_training_report
    from dihal_fast.backbone.tokenizer import train_tokenizer
    from dihal_fast.common.progress import progress_bar

    out = Path(out)
    resolve_valid(cfg)
    cfg.validate()
    if stop_at is not None and stop_at < 1:
        raise ValueError(f"--stop-at must be >= 1, got {stop_at}")
    corpus = load_corpus(cfg)
    has_checkpoint, saved_steps = check_out_dir(out, cfg, resume)
    out.mkdir(parents=True, exist_ok=True)
    precision = resolve_precision(cfg.precision, device)
    seed_everything(cfg.seed)

    if (out / "tokenizer.json").exists() and resume:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(out))
    else:
        logger.info("training a byte-level BPE tokenizer (vocab %d) on %d documents", cfg.model.vocab_size, len(corpus.train_texts))
        tokenizer = train_tokenizer(corpus.train_texts, cfg.model.vocab_size)
        tokenizer.save_pretrained(str(out))
        atomic_write_json(out / "train_config.json", cfg.to_dict())
    train_ids, valid_ids = encode_corpus(out, tokenizer, corpus)
    logger.info("tokens: train %d, valid %s", len(train_ids), {k: len(v) for k, v in valid_ids.items()})

    model = build_model(cfg.model, tokenizer).to(device)
    optimizer = make_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    sampler = WindowSampler(train_ids, cfg.model.seq_len, cfg.batch_size, cfg.seed)
    step, elapsed = 0, 0.0
    log_path = out / "training_log.jsonl"

    def log(record: dict) -> None:
        with open(log_path, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    if has_checkpoint:
        step, elapsed = load_checkpoint(out, model, optimizer, scheduler)
        truncate_log(log_path, step)
        logger.info("resumed %s at step %d (%.0f s of training so far)", out, step, elapsed)
    if saved_steps is not None:
        logger.warning("--steps changed from %d to %d: the cosine schedule is re-planned from step %d", saved_steps, cfg.steps, step)
        log({"step": step, "event": f"steps changed from {saved_steps} to {cfg.steps}"})
        atomic_write_json(out / "train_config.json", cfg.to_dict())
    end = cfg.steps if stop_at is None else min(cfg.steps, stop_at)

    def quick_eval() -> dict[str, float]:
        return {name: _mean_nll(model, ids, cfg, precision) for name, ids in valid_ids.items()}

    model.train()
    bar = progress_bar(total=end, initial=step, desc="backbone", unit="step", disable=not progress, dynamic_ncols=True)
    started = time.perf_counter() - elapsed
    window_start, window_tokens = time.perf_counter(), 0
    try:
        with sigterm_as_interrupt():
            while step < end:
                batch = sampler.batch(step).to(device)
                with autocast_context(precision, device):
                    logits = model(input_ids=batch[:, :-1]).logits
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
                loss.backward()
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                step += 1
                window_tokens += batch[:, 1:].numel()
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
                if step % LOG_EVERY == 0 or step == end:
                    now = time.perf_counter()
                    log({"step": step, "loss": loss.item(), "lr": scheduler.get_last_lr()[0], "grad_norm": grad_norm,
                         "epoch": sampler.epoch_of(step), "tokens_per_s": window_tokens / (now - window_start),
                         "elapsed_s": now - started})
                    window_start, window_tokens = now, 0
                if step % cfg.eval_every == 0 or step == end:
                    val = quick_eval()
                    log({"step": step, "val_loss": val, "elapsed_s": time.perf_counter() - started})
                    logger.info("step %d: train loss %.3f, val loss %s", step, loss.item(), {k: round(v, 3) for k, v in val.items()})
                if step % cfg.checkpoint_every == 0 or step == end:
                    save_checkpoint(out, model, optimizer, scheduler, step, time.perf_counter() - started)
                    model.save_pretrained(str(out))
    except KeyboardInterrupt:
        bar.close()
        logger.warning("interrupted at step %d; the last checkpoint in %s/%s is kept (resume with --resume)", step, out, RESUME_DIR)
        raise
    bar.close()
    return write_training_report(
        out, model, tokenizer, cfg, corpus, train_ids, valid_ids, step, time.perf_counter() - started, precision, command
    )


def _mean_nll(model, ids: np.ndarray, cfg: TrainConfig, precision: str) -> float:
    nll, count = stream_nll(model, ids, cfg.model.seq_len, max_windows=cfg.eval_windows, precision=precision)
    return nll / count



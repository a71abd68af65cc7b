"""Rehearsal, random weights: checkpoints of real models' shapes for running the pipeline at size.

Writes, for each shape named on the command line, ``OUT/<name>/`` with a ``config.json`` of the real model's
architecture (16 x 2,048 Llama-3.2-1B: intermediate 8,192, 32 heads / 8 KV heads, tied embeddings; 28 x 1,024
Qwen3-0.6B: q/k norm, tied embeddings), **random weights** (normal, std 0.02; norms 1) in bfloat16, sharded
safetensors (``save_pretrained(max_shard_size=...)``), and a 32,000-token byte-level BPE tokenizer trained on
local text (``/work/shared/data/text`` by default). Nothing about these checkpoints is a trained model: they
exist to measure time and memory of ``dihal locate / replace / evaluate / generate`` at a real width; every
directory says so in its ``REHEARSAL.md`` and config (``"rehearsal": "random weights"``).

The weights are never materialised in float32: the model is built on the meta device and its tensors are
allocated and filled in bfloat16 (peak RSS about one copy of the bf16 weights).

    python bench/make_rehearsal_model.py --out /work/runs/rehearsal/models llama-1b qwen3-0.6b
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

VOCAB = 32_000
NOTE = "rehearsal, random weights"


@dataclass(frozen=True)
class Shape:
    """A real model's architecture (its config.json fields), with the rehearsal's 32k vocabulary."""

    family: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    extra: dict = field(default_factory=dict)

    def config(self, vocab_size: int = VOCAB, bos: int = 1, eos: int = 2):
        """The transformers config of this shape (bfloat16, tied embeddings, 4,096-token context)."""
        from transformers import AutoConfig

        return AutoConfig.for_model(
            self.family,
            vocab_size=vocab_size,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            bos_token_id=bos,
            eos_token_id=eos,
            pad_token_id=eos,
            dtype="bfloat16",
            **self.extra,
        )

    def parameters(self, vocab_size: int = VOCAB) -> int:
        """Parameter count (tied embeddings): attention, SwiGLU, norms per layer, the embedding, the final norm."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = 2 * self.hidden * q + 2 * self.hidden * kv
        norms = 2 * self.hidden + (2 * self.head_dim if self.family == "qwen3" else 0)
        per_layer = attention + 3 * self.hidden * self.intermediate + norms
        return self.layers * per_layer + vocab_size * self.hidden + self.hidden


SHAPES = {
    "llama-1b": Shape("llama", 16, 2048, 8192, 32, 8, 64, {"rope_theta": 500000.0, "rms_norm_eps": 1e-5}),
    "qwen3-0.6b": Shape("qwen3", 28, 1024, 3072, 16, 8, 128, {"rope_theta": 1000000.0, "rms_norm_eps": 1e-6}),
}


def train_tokenizer(text_dir: Path, vocab_size: int = VOCAB):
    """A byte-level BPE of ``vocab_size`` tokens trained on ``text_dir/*.train.txt``, as a fast HF tokenizer
    with ``<unk>`` 0, ``<s>`` 1 (BOS), ``</s>`` 2 (EOS, also the pad token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(str(p) for p in text_dir.glob("*.train.txt"))
    if not files:
        raise SystemExit(f"no *.train.txt files in {text_dir}")
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train(files, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )


@torch.no_grad()
def random_model(shape: Shape, vocab_size: int, seed: int = 0):
    """The model of ``shape`` with random bfloat16 weights, built on the meta device (no float32 copy)."""
    from transformers import AutoModelForCausalLM

    config = shape.config(vocab_size)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(seed)
    for parameter in model.parameters():
        if parameter.dim() == 1:
            parameter.fill_(1.0)  # RMSNorm weights
        else:
            parameter.normal_(0.0, 0.02, generator=generator)
    model.tie_weights()
    return model


def write_checkpoint(name: str, out: Path, tokenizer, shard_size: str, seed: int = 0) -> Path:
    """``out/name``: the random-weight model of ``SHAPES[name]``, its tokenizer and a REHEARSAL.md note."""
    shape = SHAPES[name]
    model = random_model(shape, len(tokenizer), seed)
    model.config.rehearsal = "random weights"
    model.generation_config.bos_token_id, model.generation_config.eos_token_id = 1, 2
    model.generation_config.pad_token_id = 2
    target = out / name
    model.save_pretrained(target, max_shard_size=shard_size)
    tokenizer.save_pretrained(target)
    n = sum(p.numel() for p in model.parameters())
    (target / "REHEARSAL.md").write_text(
        f"# {name}: {NOTE}\n\nThe architecture of the real model ({shape.family}, {shape.layers} layers, hidden "
        f"{shape.hidden}, intermediate {shape.intermediate}, {shape.heads} heads / {shape.kv_heads} KV heads, "
        f"tied embeddings) with {n:,} random bfloat16 parameters and a {len(tokenizer):,}-token BPE trained on "
        "local text. Not a trained model: for measuring the pipeline's time and memory only.\n"
    )
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", nargs="+", choices=sorted(SHAPES))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--text", type=Path, default=Path("/work/shared/data/text"))
    parser.add_argument("--vocab-size", type=int, default=VOCAB)
    parser.add_argument("--shard-size", default="500MB", help="save_pretrained's max_shard_size")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tokenizer = train_tokenizer(args.text, args.vocab_size)
    for name in args.shapes:
        target = write_checkpoint(name, args.out, tokenizer, args.shard_size, args.seed)
        print(f"{name} ({NOTE}): {target}", file=sys.stderr)


if __name__ == "__main__":
    main()

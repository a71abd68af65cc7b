"""Hybrid directories of earlier versions (``hybrid_config.json``, ``bridge.safetensors``, ``upper/``,
``backbone_config.json``): refused by the loader with the conversion command, converted here.

    python -m dihal_fast.hybrid.legacy OLD_DIR [NEW_DIR]     (default: convert in place)
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from dihal_fast.common.deepspeed_banner import without_deepspeed_banner
from dihal_fast.errors import DihalValueError
from dihal_fast.hybrid.config import LEGACY_MARKER, check_not_legacy, is_legacy

__all__ = ["check_not_legacy", "convert_legacy_hybrid", "is_legacy", "main"]

LEGACY_FORMAT = "dihal_fast.hybrid"
_TABLE_PREFIX = "condition_position_table."
_LEGACY_FILES = ("hybrid_config.json", "bridge.safetensors", "backbone_config.json")


def convert_legacy_hybrid(source: str | Path, target: str | Path | None = None) -> Path:
    """Rewrite an earlier-layout hybrid directory as a transformers one (``target`` default: in place).

    The weights, configs and tokenizer are carried over unchanged, so the converted hybrid gives the same
    logits for the same explicit noise seed.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    from dihal_fast.bridge import BridgeConfig
    from dihal_fast.common import read_json
    from dihal_fast.hybrid.config import HybridConfig
    from dihal_fast.hybrid.model import HybridLM  # the converter sits above the model (no import back)

    source = Path(source)
    target = Path(target) if target is not None else source
    if not is_legacy(source):
        raise DihalValueError(
            f"{source} is not a hybrid directory in the earlier layout (no {LEGACY_MARKER}, or it has config.json)"
        )
    old = read_json(source / LEGACY_MARKER, "hybrid config")
    if old.get("format") != LEGACY_FORMAT:
        raise DihalValueError(f"not a {LEGACY_FORMAT} config (format = {old.get('format')!r})")
    bridge = BridgeConfig.from_dict(old["bridge"])
    upper_config = AutoConfig.from_pretrained(source / "upper")
    backbone_config = read_json(source / "backbone_config.json", "backbone config")
    config = HybridConfig(
        family=old["family"],
        layer=old["layer"],
        backbone_layers=old["backbone_layers"],
        max_position_embeddings=old["max_position_embeddings"],
        vocab_size=upper_config.vocab_size,
        hidden_size=bridge.hidden_size,
        bridge=bridge.to_dict(),
        upper=upper_config.to_dict(),
        backbone_dir=old.get("backbone_dir", ""),
        backbone_config=backbone_config,
        freeze_upper=old.get("freeze_upper", True),
        learned_positions=old["family"] == "gpt2",
        **{name: backbone_config.get(name) for name in ("bos_token_id", "eos_token_id", "pad_token_id")},
    )
    with torch.device("cpu"):
        model = HybridLM(config)
    tensors = load_file(str(source / "bridge.safetensors"))
    upper_files = sorted((source / "upper").glob("*.safetensors"))
    upper_state = {}
    for file in upper_files:
        upper_state.update(load_file(str(file)))
    model.upper.to(next(iter(upper_state.values())).dtype)
    model.upper.load_state_dict(upper_state, strict=False)
    model.upper.tie_weights()
    model.bridge.load_state_dict({k: v for k, v in tensors.items() if not k.startswith(_TABLE_PREFIX)})
    if model.condition_position_table is not None:
        model.condition_position_table.load_state_dict(
            {k[len(_TABLE_PREFIX) :]: v for k, v in tensors.items() if k.startswith(_TABLE_PREFIX)}
        )
    if (source / "tokenizer_config.json").is_file():
        model.tokenizer = AutoTokenizer.from_pretrained(source)
    with without_deepspeed_banner():
        model.save_pretrained(target)
    if target == source:  # save_pretrained leaves the files it does not write: the old layout's go here
        for name in _LEGACY_FILES:
            (source / name).unlink(missing_ok=True)
        shutil.rmtree(source / "upper", ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dihal_fast.hybrid.legacy", description=__doc__.splitlines()[0])
    parser.add_argument("source", help="hybrid directory in the earlier layout")
    parser.add_argument(
        "target", nargs="?", default=None, help="where to write the converted hybrid (default: in place)"
    )
    args = parser.parse_args(argv)
    try:
        print(f"converted: {convert_legacy_hybrid(args.source, args.target)}")
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

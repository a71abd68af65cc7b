"""How long does ``dihal replace`` take at a real model's size? A time model from unit costs, checked on the rehearsal.

The model: a replace run of ``S`` steps on an ``L``-layer backbone cut at hidden state ``l`` costs
``F(L) + S P(L)`` CPU seconds, with the fixed part ``F`` (imports, loading the weights, the target statistics,
building the hybrid twice, the final validation and the export) and the step ``P`` (teacher forward, the bridge's
forward and backward through its sampler, the retained layers' forward and backward, the optimizer and the EMA)
both linear in ``L``: each decoder layer adds the same bytes to load and write, the same forward to the teacher
and the same forward and backward to the retained part. The unit costs are measured on the model's own config:
``dihal replace`` runs, exactly as the rehearsal's (same corpus, batch, validation and statistics blocks, dtype,
threads; ``--layer l``), on random-weight cuts of the checkpoint to ``l + 1`` and ``l + 1 + K`` layers (``--extra``),
each with 1 and ``--steps`` steps. Then ``P(n)`` is the CPU-second difference over the extra steps, ``F(n)`` the
rest, and the slope in ``n`` of each is one layer's share (K layers apart, so that a second of noise in a run is
1 / K of a second per layer). The prediction for all ``L`` layers is compared with the rehearsal's
own ``replace`` (``bench/bench_rehearsal.py``, its ``stages.json``): nothing of the full-size run enters the
model but its layer, batch and step count.

Each run is niced on ``--threads`` threads in its own process; CPU seconds from ``os.wait4`` (the machine is
shared, so they are the load-robust figure).

    python bench/bench_replace_time.py --models /work/runs/rehearsal/models --runs /work/runs/rehearsal/runs \\
        --work /work/runs/rehearsal/replace_time --shapes qwen3-0.6b llama-1b
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from _common import report, rows_figure, table, target
from bench_rehearsal import TEXT, dihal_command, measured

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json")
WITHIN = 0.25  # the bar for the time model


def cut_checkpoint(model: Path, layers: int, out: Path) -> Path:
    """``model``'s first ``layers`` decoder layers, its embeddings, final norm and head, with its config
    (``num_hidden_layers`` and per-layer lists cut to match) and tokenizer: one safetensors file, same dtype."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    if (out / "config.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((model / "config.json").read_text())
    config["num_hidden_layers"] = layers
    for key in ("layer_types",):
        if isinstance(config.get(key), list):
            config[key] = config[key][:layers]
    index = json.loads((model / "model.safetensors.index.json").read_text())["weight_map"]
    tensors = {}
    for name, shard in index.items():
        parts = name.split(".")
        if "layers" in parts and int(parts[parts.index("layers") + 1]) >= layers:
            continue
        with safe_open(str(model / shard), framework="pt") as handle:
            tensors[name] = handle.get_tensor(name)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        if (model / name).is_file():
            shutil.copy(model / name, out / name)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def replace_command(dihal: list[str], model: Path, out: Path, settings: dict, layer: int, steps: int) -> list[str]:
    """The rehearsal's ``dihal replace`` (its saved train config's settings) on ``model`` with ``steps`` steps."""
    return [*dihal, "replace", "--model", str(model), "--corpus", str(settings["corpus"]), "--dtype",
            settings["dtype"], "--steps", str(steps), "--batch-size", str(settings["batch_size"]),
            "--val-blocks", str(settings["val_blocks"]), "--stats-blocks", str(settings["stats_blocks"]),
            "--eval-every", "0", "--layer", str(layer), "--out", str(out)]  # fmt: skip


def rehearsal_replace(run: Path) -> dict:
    """The rehearsal's replace of one shape: its CPU seconds, layer and the settings it ran with."""
    stages = json.loads((run / "stages.json").read_text())
    config = json.loads((run / "replace" / "train_config.json").read_text())
    layer = int(json.loads((run / "replace" / "result.json").read_text())["layer"])
    return {
        "cpu_s": stages["replace"]["cpu_s"],
        "wall_s": stages["replace"]["wall_s"],
        "layer": layer,
        "steps": int(config["steps"]),
        "batch_size": int(config["batch_size"]),
        "val_blocks": int(config["val_blocks"]),
        "stats_blocks": int(config["stats_blocks"]),
        "dtype": config["dtype"],
    }


def unit_costs(name: str, args: argparse.Namespace, full: dict) -> dict:
    """The four cut runs of shape ``name`` and the unit costs they give (CPU seconds)."""
    model, work = args.models / name, args.work / name
    settings = {**full, "corpus": args.text}
    layer, dihal = full["layer"], dihal_command(args.dihal)
    saved_path = work / "runs.json"
    saved = json.loads(saved_path.read_text()) if saved_path.is_file() else {}
    few, many = 1, args.steps
    depths = (layer + 1, layer + 1 + args.extra)
    for depth in depths:
        cut = cut_checkpoint(model, depth, work / f"cut{depth}")
        for steps in (few, many):
            key = f"{depth}x{steps}"
            if key in saved:
                continue
            out = work / f"run_{key}"
            shutil.rmtree(out, ignore_errors=True)
            print(f"{name}: replace on {depth} layers, {steps} step(s) ...", file=sys.stderr, flush=True)
            saved[key] = measured(replace_command(dihal, cut, out, settings, layer, steps), work / f"{key}.log",
                                  args.threads)  # fmt: skip
            saved_path.write_text(json.dumps(saved, indent=1))
            shutil.rmtree(out, ignore_errors=True)
    step, fixed = {}, {}
    for depth in depths:
        a, b = saved[f"{depth}x{few}"]["cpu_s"], saved[f"{depth}x{many}"]["cpu_s"]
        step[depth] = (b - a) / (many - few)
        fixed[depth] = a - few * step[depth]
    return {
        "runs": saved,
        "step_s": step[layer + 1],
        "step_s_per_layer": (step[depths[1]] - step[depths[0]]) / args.extra,
        "fixed_s": fixed[layer + 1],
        "fixed_s_per_layer": (fixed[depths[1]] - fixed[depths[0]]) / args.extra,
    }


def predict(costs: dict, layers: int, layer: int, steps: int) -> dict:
    """CPU seconds of a replace run of ``steps`` steps on ``layers`` layers cut at ``layer``: fixed and steps."""
    extra = layers - (layer + 1)
    step = costs["step_s"] + extra * costs["step_s_per_layer"]
    fixed = costs["fixed_s"] + extra * costs["fixed_s_per_layer"]
    return {"step_s": step, "fixed_s": fixed, "total_s": fixed + steps * step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="make_rehearsal_model.py's --out")
    parser.add_argument("--runs", type=Path, required=True, help="bench_rehearsal.py's --runs (its replace stages)")
    parser.add_argument("--work", type=Path, required=True, help="where the cut checkpoints and runs go")
    parser.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "llama-1b"])
    parser.add_argument("--steps", type=int, default=3, help="steps of the longer cut runs (the shorter run 1)")
    parser.add_argument("--extra", type=int, default=4, help="K: the deeper cut has l + 1 + K layers")
    parser.add_argument("--text", type=Path, default=TEXT, help="the rehearsal's corpus")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dihal", default=shutil.which("dihal") or str(Path(sys.executable).with_name("dihal")))
    args = parser.parse_args()
    rows, figures, targets, errors = [], {}, [], []
    for name in args.shapes:
        full = rehearsal_replace(args.runs / name)
        layers = json.loads((args.models / name / "config.json").read_text())["num_hidden_layers"]
        costs = unit_costs(name, args, full)
        predicted = predict(costs, layers, full["layer"], full["steps"])
        error = predicted["total_s"] / full["cpu_s"] - 1
        errors.append(error)
        figures[name] = {"rehearsal": full, "unit_costs": costs, "predicted": predicted, "error": error}
        rows.append([
            name, f"{layers} (l = {full['layer']})", f"{full['batch_size']} x 128", str(full["steps"]),
            f"{costs['step_s']:.1f} + {costs['step_s_per_layer']:.2f} / layer",
            f"{costs['fixed_s']:.1f} + {costs['fixed_s_per_layer']:.2f} / layer",
            f"{predicted['step_s']:.1f}", f"{predicted['fixed_s']:.0f}",
            f"{predicted['total_s']:.0f}", f"{full['cpu_s']:.0f}", f"{100 * error:+.0f} %",
        ])  # fmt: skip
    header = ["shape", "layers", "batch", "steps", "step CPU s at l + 1 layers (cut runs)",
              "fixed CPU s at l + 1 layers (cut runs)", "predicted step CPU s", "predicted fixed CPU s",
              "predicted replace CPU s", "measured (rehearsal)", "error"]  # fmt: skip
    figures["time_model"] = rows_figure(header, rows)
    worst = max(abs(e) for e in errors)
    targets.append(target(f"the unit-cost model predicts the rehearsal's replace CPU s within {WITHIN:.0%}",
                          ", ".join(f"{n} {100 * e:+.0f} %" for n, e in zip(args.shapes, errors, strict=True)),
                          worst <= WITHIN))  # fmt: skip
    body = (
        "`dihal replace`'s CPU seconds predicted from unit costs measured on cuts of the same random-weight "
        f"checkpoint (l + 1 and l + 1 + {args.extra} decoder layers, 1 and "
        f"{args.steps} steps each, the rehearsal's settings), against the rehearsal's full-size replace run; one "
        f"thread per run, niced, on a shared 2-core machine.\n\n{table(header, rows)}\n\n"
        "step: teacher forward, the bridge's forward and backward (through its sampler), the retained layers' "
        "forward and backward, optimizer and EMA; fixed: imports, loading, target statistics, building the hybrid, "
        "final validation, checkpoint and export. Each grows by the per-layer figure for every layer beyond l + 1."
    )
    report("dihal replace: a time model from unit costs, checked on the rehearsal", body, question="replace_time",
           figures=figures, targets=targets)  # fmt: skip


if __name__ == "__main__":
    main()

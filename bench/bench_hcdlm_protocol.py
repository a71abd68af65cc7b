"""Does HC-DLM solve more Sudoku boards than its baselines under one evaluation protocol, at equal budget?

For every model kind and training seed: train for the same CPU seconds (``--minutes``, process CPU time, one
thread), then score by ``dihal_fast.hcdlm.protocol``: a kind's settings (the single chain's steps, the best-of-K
diversity source and verifier) chosen on the validation file with its first seed's run and frozen for its other
seeds, then single chain, best-of-K and oracle@K on the test file, each with its passes per puzzle. The record
holds one table per mode (seeds as rows, then the mean) and, per mode, each kind's accuracy minus the first kind's
with a paired bootstrap interval over training seeds and test puzzles together; latent kinds add the in-sampler
interventions. The splits are checked disjoint (with every run's training pool) and hashed into the record.

    python bench/bench_hcdlm_protocol.py --val VAL.csv --test TEST.csv --models hcdlm,mdm --seeds 0,1,2 \
        --minutes 30 --k 8 --steps-choices 36,50,100 --out RUNS [--sudoku-box 2x3] [--question NAME] \
        [--lr hcdlm=3e-3,mdm=1e-3] [--lr-record hcdlm_lr_search] [--train-only]

``--train-only`` trains (or resumes) the runs and stops: two processes can pretrain disjoint kinds or seeds into
the same ``--out``, and the full command then resumes each finished run (same config) and scores it.

Each kind's choice on validation and each run's test result are kept beside the runs (``OUT/protocol/choice/`` and
``OUT/protocol/test-SHA/``, see :func:`run_one`) and reused when their inputs match, so a killed scoring loses at
most the run in progress, and the same command with another ``--test`` file (and ``--question``) scores it with the
settings already chosen. ``--no-record`` trains and scores the named runs and writes no record: two processes can
score disjoint kinds, then the full command reads their results and writes the record.

``--variant NAME=FIELD=VALUE;...;sample.FIELD=VALUE`` (repeated; one kind in ``--models``, ``--val``, no test):
each variant's seed-0 run (``OUT/variants/...``; a variant without run fields is the protocol's own seed-0 run)
scored by its single chain on validation at each of ``--steps-choices``, against the first variant with a
paired bootstrap interval; ``--train-only`` with ``--variant`` trains those runs only; ``--curve`` keeps the record's
rows at other ``--minutes``, so the same command at growing budgets (the runs resumed) builds a learning curve in
one record. The faithfulness rows:

    --models hcdlm --lr hcdlm=3e-3 --variant ours --variant slot_off=slot_aux_weight=0 \\
        --variant guidance=guidance_training=true;sample.cfg_weight=2.75

``--run-fields KIND:FIELD=VALUE;...`` (repeated) trains every run of KIND with those fields (e.g. a baseline's width
and depth, chosen on validation with ``--variant``) in ``OUT/variants/FIELD=VALUE_.../KIND_seedS`` (where that
variant's seed-0 run already is); its choice and test results are kept under names with the fields, and the record
states them. ``--match-sampling KIND:WIDTH,...`` (repeated) sets KIND's width and blocks so: the shape among those
widths whose sampling parameters (the parameters a chain reads, HC-DLM's encoder aside) come closest to the
HC-DLM's (``dihal_fast.hcdlm.models.matched_shape``). Every table states both counts of each run.

``--lr-search 1e-3,3e-3 --val VAL.csv`` scores no test file: for every kind, lr and seed it resumes the run in
``OUT/lr<LR>/<kind>_seed<S>`` and scores its single chain (argmax) on validation at each of ``--steps-choices``;
each kind's lr is the one with the most accurate chain (ties: the first listed), and the record (``--question``,
e.g. hcdlm_lr_search) holds the table, the choice, the validation sha256 and the time it was frozen. The scoring
command then names it with ``--lr-record``: its ``--lr`` must be the record's choice, made on a file other than
``--test``; the test record states per kind when the lr was frozen, the validation file it was chosen on (another
grid's when it is carried over, ``lr_carried_over``) and when the test was scored.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, read_record, report, rows_figure, table  # noqa: E402

from dihal_fast.common.io import atomic_write_json, make_directories, read_json  # noqa: E402
from dihal_fast.hcdlm.api import check_run_splits, file_sha256  # noqa: E402
from dihal_fast.hcdlm.config import RunConfig, SampleConfig  # noqa: E402
from dihal_fast.hcdlm.eval_data import examples_from_file  # noqa: E402
from dihal_fast.hcdlm.mechanism import in_sampler_interventions  # noqa: E402
from dihal_fast.hcdlm.models import KINDS, build_model, kind_of, matched_shape, sampling_parameters  # noqa: E402
from dihal_fast.hcdlm.protocol import (  # noqa: E402
    chosen_configs,
    protocol_choice,
    protocol_rows,
    single_chain,
    single_chain_row,
)
from dihal_fast.hcdlm.scoring import accuracy_vs_steps, load_run  # noqa: E402
from dihal_fast.hcdlm.stats import paired_bootstrap, points_text  # noqa: E402
from dihal_fast.hcdlm.trainer import train  # noqa: E402
from dihal_fast.tasks.registry import build_task  # noqa: E402

MODES = ("single", "best_of", "oracle")


def parse_lrs(text: str, kinds: list[str]) -> dict[str, float]:
    """``kind=lr,...`` -> {kind: lr}; a kind not named keeps the task default (absent from the mapping)."""
    lrs: dict[str, float] = {}
    for item in filter(None, text.split(",")):
        kind, sep, value = item.partition("=")
        if not sep or kind not in kinds:
            raise SystemExit(f"--lr takes kind=value for the kinds of --models {kinds}, got {item!r}")
        lrs[kind] = float(value)
    return lrs


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def fields_words(fields: dict) -> str:
    """Run fields as a folder name: ``baseline_blocks=12_hidden=128``."""
    return "_".join(f"{key}={value}" for key, value in sorted(fields.items()))


def parse_run_fields(texts: list[str], kinds: list[str]) -> dict[str, dict]:
    """``KIND:FIELD=VALUE;...`` (repeated) -> {kind: run fields}, VALUE read as JSON."""
    found = {}
    for text in texts:
        kind, sep, rest = text.partition(":")
        items = [item.partition("=") for item in filter(None, rest.split(";"))]
        if not (sep and kind in kinds and items and all(key and eq and "." not in key for key, eq, _ in items)):
            raise SystemExit(f"--run-fields takes KIND:FIELD=VALUE;... for a kind of --models {kinds}, got {text!r}")
        try:
            found[kind] = {key: json.loads(value) for key, _, value in items}
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--run-fields {text!r}: a VALUE is not JSON ({exc})") from None
    return found


def sampling_matched(texts: list[str], kinds: list[str], sudoku_box: str, run_fields: dict[str, dict]) -> dict:
    """``KIND:WIDTH,...`` (repeated) -> {kind: {"hidden": W, "baseline_blocks": N}}: the shape among those widths at
    which KIND samples with the parameter count closest to the HC-DLM's (its ``run_fields`` over the task
    defaults)."""
    found = {}
    for text in texts:
        kind, sep, rest = text.partition(":")
        if not (sep and kind in kinds and kind != "hcdlm" and all(width.isdigit() for width in rest.split(","))):
            raise SystemExit(f"--match-sampling takes KIND:WIDTH,... for a baseline of --models {kinds}, got {text!r}")
        widths = [int(width) for width in rest.split(",")]
        hcdlm = RunConfig.for_task(name="sudoku", sudoku_box=sudoku_box, **run_fields.get("hcdlm", {}))
        spec = build_task(hcdlm.task, for_training=False).spec
        baseline = RunConfig.for_task(name="sudoku", sudoku_box=sudoku_box, kind=kind)
        found[kind] = matched_shape(spec, baseline.model, widths, sampling_parameters(build_model(spec, hcdlm.model)))
    return found


def parameter_counts(summary: dict) -> list[int]:
    """A run's parameters, all and those a chain reads when it samples (its train summary's)."""
    return [summary["parameters"], summary["sampling_parameters"]]


def train_one(
    kind: str, seed: int, args: argparse.Namespace, out: Path | None = None, fields: dict | None = None
) -> tuple[Path, dict]:
    """Train (or resume) one run for ``--minutes`` of process CPU time in ``out`` (default ``--out``), ``fields``
    (flat RunConfig fields, as ``dihal hcdlm train``'s options; default: the kind's ``--run-fields``) over the
    defaults, in ``variants/FIELD=VALUE_...`` below ``out`` when there are any; its folder and summary."""
    fields = args.run_fields.get(kind, {}) if fields is None else fields
    lr = {"lr": args.lrs[kind]} if kind in args.lrs else {}
    config = RunConfig.for_task(
        name="sudoku",
        sudoku_box=args.sudoku_box,
        sudoku_pool=args.pool,
        kind=kind,
        seed=seed,
        steps=10**7,
        max_minutes=args.minutes,
        budget_clock="cpu",
        threads=1,
        checkpoint_every=args.checkpoint_every,
        **lr,
        **fields,
    )
    base = Path(out or args.out)
    folder = (base / "variants" / fields_words(fields) if fields else base) / f"{kind}_seed{seed}"
    return folder, dict(train(config, folder))


def kept(path: Path, key: dict) -> dict | None:
    """The value kept in ``path`` when it was made from ``key`` (None otherwise)."""
    if path.is_file():
        found = read_json(path, "protocol result")
        if found.get("key") == key:
            print(f"{path}: made before from the same inputs, reused")
            return found["value"]
    return None


def keep(path: Path, key: dict, value: dict) -> None:
    """Write ``value`` with the ``key`` it was made from (read back by :func:`kept`)."""
    make_directories(path.parent)
    atomic_write_json(path, {"key": key, "value": value})


class KeptCandidates(dict):
    """The validation candidates' rows of a choice in progress, written to ``path`` (under ``key``) as each one is
    scored, so a killed choice resumes at the candidate it was scoring (``protocol_choice``'s ``memo``)."""

    def __init__(self, path: Path, key: dict) -> None:
        super().__init__(kept(path, key) or {})
        self.path, self.key = path, key

    def __setitem__(self, settings: str, rows: list[dict]) -> None:
        super().__setitem__(settings, rows)
        keep(self.path, self.key, dict(self))


def run_one(kind: str, seed: int, args: argparse.Namespace, chosen: dict | None = None) -> dict:
    """Train (or resume) one run and score it by the protocol; the run's summary, protocol rows and split sizes.

    ``chosen`` (the ``chosen`` settings of the kind's first seed): the run is scored on the test file with those,
    nothing is chosen again; without it the settings are chosen on validation first. Both are kept beside the runs
    (``OUT/protocol/choice/KIND_seedS.json``, keyed by the validation sha256, K, the step choices, the seed and the
    trained step; ``OUT/protocol/test-SHA/KIND_seedS.json`` per test file, keyed by those, the test sha256 and the
    settings) and reused, so another test file is scored with the settings already chosen; a choice in progress
    keeps each validation candidate as it is scored (``choice/KIND_seedS.partial.json``), so a killed scoring
    resumes at the candidate or run it was scoring. A latent kind is also scored by the in-sampler interventions at its
    single-chain settings."""
    folder, summary = train_one(kind, seed, args)
    common = {"k": args.k, "steps_choices": args.steps_choices, "seed": seed, "trained_step": summary["step"]}
    choice_key = {**common, "validation_sha256": args.hashes["validation_sha256"]}
    name = "_".join(filter(None, [kind, fields_words(args.run_fields.get(kind, {})), f"seed{seed}"])) + ".json"
    choice_path = Path(args.out) / "protocol" / "choice" / name
    choice = {"chosen": chosen} if chosen else kept(choice_path, choice_key)
    test_path = Path(args.out) / "protocol" / f"test-{args.hashes['test_sha256'][:12]}" / name
    test_key = {**common, **args.hashes}  # with the settings scored: "chosen"
    if choice and (found := kept(test_path, {**test_key, "chosen": choice["chosen"]})):
        return {**found, "summary": summary}  # the run's summary as it reads now (the same trained step)
    run = load_run(folder, device="cpu")
    validation, test = examples_from_file(run.task, args.val), examples_from_file(run.task, args.test)
    splits = check_run_splits(run, folder, validation, test)
    if choice is None:
        partial = KeptCandidates(choice_path.with_suffix(".partial.json"), choice_key)
        sample = SampleConfig(steps=args.steps_choices[0])
        choice = protocol_choice(run, validation, sample, args.k, tuple(args.steps_choices), seed, partial)
        keep(choice_path, choice_key, choice)
        partial.path.unlink(missing_ok=True)
    single, diverse = chosen_configs(choice["chosen"])
    rows = protocol_rows(run, test, single, diverse, seed)
    result = {"summary": summary, "protocol": {**choice, "rows": rows}, "splits": splits, "scored_at": now()}
    if kind_of(run.model).latent:
        result["interventions"] = in_sampler_interventions(run, test, single, seed)
    keep(test_path, {**test_key, "chosen": choice["chosen"]}, result)
    return result


def score_kind(kind: str, seeds: list[int], args: argparse.Namespace) -> dict[tuple[str, int], dict]:
    """Every seed of ``kind`` scored: the settings chosen on validation with the first seed's run, then frozen and
    used for the others (the kind's protocol, chosen once, not per seed)."""
    first = run_one(kind, seeds[0], args)
    chosen = first["protocol"]["chosen"]
    return {(kind, seeds[0]): first, **{(kind, seed): run_one(kind, seed, args, chosen) for seed in seeds[1:]}}


def settings_text(settings: dict) -> str:
    """A row's sampler settings in a few words: ``50 steps, T 0, reveal noise 0.1, givens, final verifier``."""
    words = [f"{settings['steps']} steps", f"T {settings['temperature']:g}"]
    words += [f"reveal noise {settings['reveal_noise']:g}"] if settings["reveal_noise"] else []
    words += ["givens"] if settings["givens"] else []
    words += [f"{settings['verifier']} verifier"] if settings["best_of"] > 1 else []
    return ", ".join(words)


def choices_table(results: dict, kinds: list[str]) -> tuple[dict, str]:
    """Each kind's candidates on validation with its first seed's run (the evidence for its frozen settings):
    accuracy and passes per puzzle of every single-chain step count and best-of-K source x verifier."""
    header = ["model", "seed", "mode", "settings", "validation accuracy %", "passes / puzzle", "chosen"]
    rows = []
    for (kind, seed), found in results.items():
        protocol = found["protocol"]
        if "validation" not in protocol:  # a later seed: scored with the first seed's settings
            continue
        chosen = [protocol["chosen"]["single"], protocol["chosen"]["best_of"]]
        for row in protocol["validation"]:
            mark = "yes" if row["settings"] in chosen else ""
            rows.append(
                [kind, seed, row["mode"], settings_text(row["settings"]), round(100 * row["accuracy"], 1)]
                + [round(row["passes"]), mark]
            )
    text = f"\nchosen on validation (first seed per kind, then frozen):\n\n{table(header, rows)}"
    return {"validation_choices": rows_figure(header, rows)}, text


def interventions_table(results: dict, kinds: list[str]) -> tuple[dict, str]:
    """Latent kinds' in-sampler interventions on the test file, seeds as rows: every variant's accuracy and normal
    minus ``latent_reencoded`` (the information the latent carries beyond the tokens), per seed over the puzzles
    and pooled over seeds and puzzles (two-stage paired bootstrap)."""
    figures, body = {}, []
    for kind in kinds:
        found = [(seed, r["interventions"]) for (k, seed), r in results.items() if k == kind and "interventions" in r]
        if not found:
            continue
        names = list(found[0][1]["variants"])
        header = ["seed", *(f"{name} %" for name in names), "normal - latent_reencoded, points"]
        rows = [
            [
                seed,
                *(round(100 * f["variants"][n]["accuracy"], 1) for n in names),
                points_text(f["latent_beyond_tokens"]),
            ]
            for seed, f in found
        ]
        pooled = paired_bootstrap(
            [f["correct"]["normal"] for _, f in found], [f["correct"]["latent_reencoded"] for _, f in found]
        )
        means = [round(100 * sum(f["variants"][n]["accuracy"] for _, f in found) / len(found), 1) for n in names]
        rows.append(["mean", *means, points_text(pooled)])
        figures[f"interventions_{kind}"] = rows_figure(header, rows)
        figures[f"latent_beyond_tokens_{kind}"] = pooled
        body.append(
            f"\n{kind}: in-sampler interventions at the single chain's settings, test file\n\n{table(header, rows)}"
        )
    return figures, "\n".join(body)


def lr_search(kinds: list[str], seeds: list[int], args: argparse.Namespace) -> None:
    """Each kind's lr chosen on validation by its single chain (see the module docstring); the record."""
    lrs = [text for text in args.lr_search.split(",") if text]
    header = ["model", "lr", "seed", "trained s", "steps", "parameters", "sampling parameters"]
    header += [f"{steps} steps %" for steps in args.steps_choices] + ["easy / hard % (best)"]
    rows, best = [], {}
    for kind in kinds:
        for text in lrs:
            args.lrs = {kind: float(text)}
            accuracies = []
            for seed in seeds:
                folder, summary = train_one(kind, seed, args, Path(args.out) / f"lr{text}")
                run = load_run(folder, device="cpu")
                validation = examples_from_file(run.task, args.val)
                check_run_splits(run, folder, validation, [])
                cfg = single_chain(run, SampleConfig(), args.steps_choices[0])
                curve = accuracy_vs_steps(run, validation, args.steps_choices, cfg, seed)
                top = max(curve, key=lambda row: row["accuracy"])
                accuracies.append(top["accuracy"])
                groups = " / ".join(f"{100 * g['accuracy']:.1f}" for g in top["groups"].values())
                trained = [round(summary["elapsed_s"]), summary["step"], *parameter_counts(summary)]
                rows.append(
                    [kind, float(text), seed, *trained, *[round(100 * r["accuracy"], 1) for r in curve], groups]
                )
            mean = sum(accuracies) / len(accuracies)
            if kind not in best or mean > best[kind][1]:
                best[kind] = (float(text), mean)
    chosen = {kind: lr for kind, (lr, _) in best.items()}
    figures = {
        "lr_search": rows_figure(header, rows),
        "chosen": chosen,
        "validation_sha256": file_sha256(args.val),
        "frozen_at": now(),
    }
    body = f"validation {figures['validation_sha256'][:16]} (sha256), single chain (argmax)\n\n{table(header, rows)}"
    body += "\n\nchosen on validation: " + ", ".join(f"{kind} lr {lr:g}" for kind, lr in chosen.items())
    report(
        f"Sudoku {args.sudoku_box}: lr chosen on validation at {args.minutes:g} CPU-minutes (single chain)",
        body,
        question=args.question,
        figures=figures,
    )


def parse_variant(text: str) -> tuple[str, dict, dict]:
    """``NAME`` or ``NAME=FIELD=VALUE;FIELD=VALUE;sample.FIELD=VALUE`` -> ``(name, run fields, sampler fields)``
    (VALUE read as JSON; ``sample.`` fields set the scoring's SampleConfig)."""
    name, _, rest = text.partition("=")
    run_fields, sample_fields = {}, {}
    for item in filter(None, rest.split(";")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {text!r}: {item!r} is not FIELD=VALUE")
        target, key = (sample_fields, key[len("sample.") :]) if key.startswith("sample.") else (run_fields, key)
        target[key] = json.loads(value)
    return name, run_fields, sample_fields


def variant_fields(kind: str, own: dict, args: argparse.Namespace) -> dict:
    """The run fields a ``--variant`` of ``kind`` trains with: the kind's ``--run-fields`` and ``--match-sampling``
    shape, then the variant's own fields over them."""
    return {**args.run_fields.get(kind, {}), **own}


def faithfulness(kind: str, args: argparse.Namespace) -> None:
    """Each ``--variant`` of ``kind`` (seed 0, the protocol's lr and budget; the first variant is the reference,
    a variant with no run fields is the protocol's own seed-0 run) scored by its single chain on validation at each
    of ``--steps-choices``; the best steps' per-puzzle results against the first variant's, with a paired bootstrap
    interval over the validation puzzles; a latent kind adds, at the best steps, the accuracy the chain loses with
    the denoiser's x_t reset to the prior at every step (what the latent carries at all) and with its latent
    re-encoded from its argmax tokens at every step (what it carries beyond the tokens); the record
    ``--question`` (with ``--curve``, the record's rows at other budgets kept beside this budget's)."""
    variants = [parse_variant(text) for text in args.variant]
    header = ["variant", *(["CPU min"] if args.curve else []), "run fields", "sampler fields", "trained s", "steps"]
    header += ["parameters", "sampling parameters"]
    header += [f"{steps} steps %" for steps in args.steps_choices] + ["easy / hard % (best)", "minus first (points)"]
    header += ["normal - x_t prior (points)", "normal - re-encoded (points)"] if KINDS[kind].latent else []
    rows, found, reference = [], {}, None
    if args.curve:  # the record's rows at the other budgets stay: one record per curve
        rows, found = earlier_budgets(args, header)
    for name, own_fields, sample_fields in variants:
        run_fields = variant_fields(kind, own_fields, args)
        folder, summary = train_one(kind, 0, args, fields=run_fields)
        run = load_run(folder, device="cpu")
        validation = examples_from_file(run.task, args.val)
        check_run_splits(run, folder, validation, [])
        scored = [
            single_chain_row(run, validation, single_chain(run, SampleConfig(**sample_fields), steps))
            for steps in args.steps_choices
        ]
        best = max(scored, key=lambda row: row["accuracy"])
        reference = best if reference is None else reference
        gap = paired_bootstrap([best["correct"]], [reference["correct"]])
        groups = " / ".join(f"{100 * g['accuracy']:.1f}" for g in best["groups"].values())
        entry = f"{name}@{args.minutes:g}min" if args.curve else name
        found[entry] = {"minutes": args.minutes, "run_fields": run_fields, "sample_fields": sample_fields,
                        "summary": summary, "best": best, "minus_first": gap,
                        "accuracy_by_steps": {r["settings"]["steps"]: r["accuracy"] for r in scored}}  # fmt: skip
        probe = []
        if KINDS[kind].latent:
            single = SampleConfig(**{**sample_fields, **best["settings"]})
            probes = in_sampler_interventions(
                run, validation, single, interventions=("latent_prior", "latent_reencoded")
            )
            found[entry]["latent_beyond_tokens"] = probes["latent_beyond_tokens"]
            found[entry]["latent_carried"] = probes["normal_minus"]["latent_prior"]
            probe = [points_text(probes["normal_minus"][which]) for which in ("latent_prior", "latent_reencoded")]
        fields_text = " ".join(f"{key}={value}" for key, value in sorted(run_fields.items()))
        rows.append([name, *([args.minutes] if args.curve else []), fields_text or "(defaults)",
                     " ".join(f"{k}={v}" for k, v in sample_fields.items()),
                     round(summary["elapsed_s"]), summary["step"], *parameter_counts(summary),
                     *[round(100 * r["accuracy"], 1) for r in scored], groups,
                     "" if best is reference else points_text(gap), *probe])  # fmt: skip
    if args.curve:
        rows.sort(key=lambda row: (row[0], row[1]))
    figures = {"variants": found, "table": rows_figure(header, rows), "validation_sha256": file_sha256(args.val)}
    budget = "each row one run resumed to its CPU-minutes" if args.curve else f"{args.minutes:g} CPU-minutes"
    body = (
        f"{kind}, seed 0, {budget}, validation {figures['validation_sha256'][:16]} (sha256), "
        f"single chain (argmax), best steps per variant; interval: paired bootstrap over validation puzzles "
        f"(2,000 draws, 95 %)\n\n{table(header, rows)}"
    )
    report(f"Sudoku {args.sudoku_box}: {kind} variants, one at a time (single chain, validation)",
           body, question=args.question, figures=figures)  # fmt: skip


def earlier_budgets(args: argparse.Namespace, header: list[str]) -> tuple[list[list], dict]:
    """The rows and variants of the ``--curve`` record ``--question`` scored at budgets other than ``--minutes``
    (none when there is no record yet); refused when it was scored on another validation file or grid."""
    path = RESULTS_DIR / f"{args.question}.json"
    if not path.is_file():
        return [], {}
    figures = read_record(path)["figures"]
    if figures["validation_sha256"] != file_sha256(args.val):
        raise SystemExit(f"{path} was scored on another validation file than {args.val}")
    if figures["table"]["columns"] != header:
        raise SystemExit(
            f"{path} has other columns (steps choices, kind) than this run's: {figures['table']['columns']}"
        )
    rows = [row for row in figures["table"]["rows"] if row[1] != args.minutes]
    variants = {key: value for key, value in figures["variants"].items() if value["minutes"] != args.minutes}
    return rows, variants


def frozen_lr(args: argparse.Namespace) -> dict:
    """What ``--lr-record`` (one or more lr-search records, comma-separated) says of the lr: the records, the lr
    and, per kind, when its lr was frozen and the validation file it was chosen on (its sha256; another grid's
    validation file when an lr is carried over, e.g. from 6x6 to 9x9). Refused unless together the records chose
    exactly ``--lr`` and none chose it on the ``--test`` file (``args.hashes``: the two files' sha256)."""
    names = [name for name in args.lr_record.split(",") if name]
    chosen, frozen_at, chosen_on = {}, {}, {}
    for name in names:
        found = read_record(RESULTS_DIR / f"{name}.json")["figures"]
        if found.get("validation_sha256") == args.hashes["test_sha256"]:
            raise SystemExit(f"{name} chose its lr on the test file {args.test}")
        kinds = found.get("chosen", {})
        chosen.update(kinds)
        frozen_at.update(dict.fromkeys(kinds, found["frozen_at"]))
        chosen_on.update(dict.fromkeys(kinds, found["validation_sha256"]))
    if chosen != args.lrs:
        raise SystemExit(f"--lr {args.lrs} is not the lr {args.lr_record} chose on validation: {chosen}")
    carried = sorted(kind for kind, sha in chosen_on.items() if sha != args.hashes["validation_sha256"])
    return {
        "lr_record": names,
        "lr": args.lrs,
        "lr_frozen_at": frozen_at,
        "lr_chosen_on": chosen_on,
        "lr_carried_over": carried,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--val", help="validation CSV (settings and lr are chosen on it)")
    parser.add_argument("--test", help="test CSV, scored once every choice is frozen")
    parser.add_argument("--models", default="hcdlm,mdm", help="model kinds, comma-separated")
    parser.add_argument("--seeds", default="0,1,2", help="training seeds, comma-separated")
    parser.add_argument("--minutes", type=float, default=30.0, help="training budget per run, process CPU minutes")
    parser.add_argument("--k", type=int, default=8, help="chains per puzzle for best-of-K and oracle@K")
    parser.add_argument("--steps-choices", default="36,50,100", help="sampling steps to choose from on validation")
    parser.add_argument("--sudoku-box", default="2x3", help="box shape RxC (2x3: 6x6 boards, 3x3: 9x9)")
    parser.add_argument("--pool", type=int, default=3000, help="generated training puzzles per run")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=500,
        help="training steps between checkpoints: a killed training resumes there, its CPU seconds kept",
    )
    parser.add_argument("--out", required=True, help="folder of the training runs (KIND_seedS)")
    parser.add_argument("--question", default="hcdlm_protocol", help="record name in bench/results/")
    parser.add_argument("--lr", default="", help="kind=lr,... (chosen on validation); others keep the default")
    parser.add_argument("--train-only", action="store_true", help="train or resume the runs, score nothing")
    parser.add_argument("--no-record", action="store_true", help="train and score the runs, write no record")
    parser.add_argument("--lr-search", default="", help="LR,LR,...: choose each kind's lr on --val (no test)")
    parser.add_argument(
        "--lr-record", default="", help="the lr-search record(s) the --lr was chosen by, comma-separated"
    )
    parser.add_argument(
        "--run-fields",
        action="append",
        default=[],
        help="KIND:FIELD=VALUE;...: train every run of KIND with these RunConfig fields (e.g. a baseline's width "
        "and depth chosen on validation with --variant), in OUT/variants/FIELD=VALUE_.../",
    )
    parser.add_argument(
        "--match-sampling",
        action="append",
        default=[],
        help="KIND:WIDTH,...: train KIND at the width (among these) and blocks whose sampling parameters come closest "
        "to the HC-DLM's",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME[=FIELD=VALUE;...;sample.FIELD=VALUE]: score these variants of the one --models kind on --val",
    )
    parser.add_argument(
        "--curve",
        action="store_true",
        help="with --variant: the record --question holds a learning curve, its rows at other --minutes kept (resume "
        "the same runs with a larger --minutes to add a point)",
    )
    args = parser.parse_args()
    if args.checkpoint_every < 1:
        parser.error(f"--checkpoint-every must be >= 1, got {args.checkpoint_every}")
    args.steps_choices = [int(s) for s in args.steps_choices.split(",")]
    kinds, seeds = args.models.split(","), [int(s) for s in args.seeds.split(",")]
    args.lrs = parse_lrs(args.lr, kinds)
    args.run_fields = parse_run_fields(args.run_fields, kinds)
    for kind, shape in sampling_matched(args.match_sampling, kinds, args.sudoku_box, args.run_fields).items():
        args.run_fields[kind] = {**args.run_fields.get(kind, {}), **shape}
    if args.train_only and args.variant:
        for _, own_fields, _ in map(parse_variant, args.variant):
            folder, summary = train_one(kinds[0], 0, args, fields=variant_fields(kinds[0], own_fields, args))
            print(f"{folder}: {summary['step']} steps, {summary['elapsed_s']:.0f} s, {summary['parameters']} p")
        return
    if args.train_only:
        for kind in kinds:
            for seed in seeds:
                folder, summary = train_one(kind, seed, args)
                print(f"{folder}: {summary['step']} steps, {summary['elapsed_s']:.0f} s, {summary['parameters']} p")
        return
    if args.variant:
        if not args.val or len(kinds) != 1:
            raise SystemExit("--variant needs --val and one kind in --models")
        return faithfulness(kinds[0], args)
    if args.lr_search:
        if not args.val:
            raise SystemExit("--lr-search needs --val")
        return lr_search(kinds, seeds, args)
    if not (args.val and args.test):
        raise SystemExit("--val and --test are required unless --train-only or --lr-search")
    args.hashes = {"test_sha256": file_sha256(args.test), "validation_sha256": file_sha256(args.val)}
    figures: dict = frozen_lr(args) if args.lr_record else {}
    results = {key: found for kind in kinds for key, found in score_kind(kind, seeds, args).items()}
    if args.no_record:
        return
    figures["test_scored_at"] = {  # per kind: after its lr (lr_frozen_at) and settings were frozen
        kind: min(found["scored_at"] for (owner, _), found in results.items() if owner == kind) for kind in kinds
    }
    groups = " / ".join(next(iter(results.values()))["protocol"]["rows"][0]["groups"])
    header = ["model", "seed", "trained s", "steps", "parameters", "sampling parameters", "accuracy %", f"{groups} %"]
    header += ["passes / puzzle", "block passes / puzzle", "at width 64", "settings"]
    figures.update(args.hashes)
    figures["run_fields"] = args.run_fields
    body = [
        f"test {figures['test_sha256'][:16]}, validation {figures['validation_sha256'][:16]} (sha256); intervals: "
        "paired bootstrap over training seeds and test puzzles together (2,000 draws, 95 %), seeds paired by number "
        "(same training pool)"
    ]
    if args.lr_record:
        body += [
            f"lr {kind} {lr:g}: frozen {figures['lr_frozen_at'][kind]} on validation "
            + ("--val" if kind not in figures["lr_carried_over"] else figures["lr_chosen_on"][kind][:16])
            for kind, lr in figures["lr"].items()
        ]
    body += [f"{kind} trained with {fields_words(fields)}" for kind, fields in args.run_fields.items()]
    for index, mode in enumerate(MODES):
        rows, correct = [], {kind: [] for kind in kinds}
        for (kind, seed), found in results.items():
            row = found["protocol"]["rows"][index]
            correct[kind].append(row["correct"])
            groups = " / ".join(f"{100 * g['accuracy']:.1f}" for g in row["groups"].values())
            summary = found["summary"]
            trained = [round(summary["elapsed_s"]), summary["step"], *parameter_counts(summary)]
            scores = [round(100 * row["accuracy"], 1), groups, round(row["passes"]), round(row["block_passes"])]
            width64 = row.get("width64_block_passes")  # absent from rows scored before it was counted
            scores += ["" if width64 is None else round(width64), settings_text(row["settings"])]
            rows.append([kind, seed, *trained, *scores])
        for kind in kinds:
            accuracy = sum(map(sum, correct[kind])) / sum(map(len, correct[kind]))
            rows.append([kind, "mean", "", "", "", "", round(100 * accuracy, 1), "", "", "", "", ""])
        figures[mode] = rows_figure(header, rows)
        gaps = {kind: paired_bootstrap(correct[kind], correct[kinds[0]]) for kind in kinds[1:]}
        figures[f"{mode}_minus_{kinds[0]}"] = gaps
        body.append(f"\n{mode} (K = {args.k} for best_of / oracle):\n\n{table(header, rows)}")
        body += [f"{kind} - {kinds[0]}: {points_text(gap)} points" for kind, gap in gaps.items()]
    found_choices, text = choices_table(results, kinds)
    figures.update(found_choices)
    body.append(text)
    found_interventions, text = interventions_table(results, kinds)
    figures.update(found_interventions)
    body.append(text)
    report(
        f"Sudoku {args.sudoku_box}: single chain, best-of-{args.k} and oracle@{args.k} at {args.minutes:g} CPU-minutes",
        "\n".join(body),
        question=args.question,
        figures=figures,
    )


if __name__ == "__main__":
    main()

"""CCDD on 6x6 Sudoku in bench_hcdlm's harness: training, sampler choice on validation, the test split, and a
probe of how its two chains share the work.

Question: at the CPU budget and parameter count of HC-DLM and MDM (bench_hcdlm's puzzles and settings), how
many boards does CCDD (a masked token chain and an embedding chain denoised together, ``--model ccdd``) solve,
and which chain carries the solution? The probe samples the validation boards three ways: the joint sampler;
with the embedding input replaced by pure noise at level 1 every step (the token chain alone, as an MDM); with
the embedding input at every step the true code noised to the step's level (an oracle embedding chain).

Takes bench_hcdlm's flags (``--tasks sudoku --models ccdd`` unless given) and two of its own: ``--probe-n N``
(validation boards per group for the probe; default all of ``--val-n``) and ``--from-results`` (reuse the
``sudoku_results.json`` an earlier run of this script wrote to ``--out`` instead of evaluating again, e.g. to rerun
the probe alone); writes bench/results/hcdlm_ccdd.json.

    python bench/bench_hcdlm_ccdd.py --minutes 10 --out runs/ccdd
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_hcdlm  # noqa: E402
from _common import markdown_tables, report, table  # noqa: E402

from dihal_fast.common import read_json  # noqa: E402
from dihal_fast.hcdlm.config import SampleConfig  # noqa: E402
from dihal_fast.hcdlm.mechanism import reference_targets  # noqa: E402
from dihal_fast.hcdlm.noise import LATENT_FLOW  # noqa: E402
from dihal_fast.hcdlm.sampler import reveal_confident  # noqa: E402
from dihal_fast.hcdlm.scoring import load_run, mean_scores  # noqa: E402

PROBES = ("joint", "embedding_noise", "embedding_oracle")


@torch.no_grad()
def probe(run, examples: list, mode: str, steps: int = 50, seed: int = 0) -> dict:
    """Scores of the CCDD sampler with the embedding input kept (``joint``), replaced by noise at level 1
    (``embedding_noise``) or by the true code noised to the step's level (``embedding_oracle``)."""
    model, generator = run.model, torch.Generator().manual_seed(seed)
    context = torch.tensor([ex.context for ex in examples])
    truth_code = model.embed(reference_targets(run, examples))
    batch, length = context.shape[0], model.spec.target_len
    tokens = torch.full((batch, length), model.mask_id, dtype=torch.long)
    z = torch.randn(truth_code.shape, generator=generator)
    cfg = SampleConfig(steps=steps)
    for i in range(1, steps + 1):
        t = steps - i + 1
        s = torch.full((batch,), t / steps)
        z_in, s_in = z, s
        if mode == "embedding_noise":
            z_in, s_in = torch.randn(z.shape, generator=generator), torch.ones(batch)
        elif mode == "embedding_oracle":
            z_in = LATENT_FLOW.noise(truth_code, s, torch.randn(z.shape, generator=generator))
        logits, z_hat = model(z_in, tokens, s_in, context)
        masked = tokens == model.mask_id
        n_new = int(masked.sum(dim=1).max()) - int(round(length * (steps - i) / steps))
        tokens = reveal_confident(tokens, logits.to(torch.float64), masked, n_new, cfg, generator)
        z = LATENT_FLOW.euler_step(z, z_hat, t)
    return mean_scores([run.task.score(ex, target) for ex, target in zip(examples, tokens.tolist())])


def main() -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--probe-n", type=int, default=None)
    own.add_argument("--from-results", action="store_true")
    mine, rest = own.parse_known_args()
    sys.argv[1:] = ["--tasks", "sudoku", "--models", "ccdd", *rest]  # defaults; flags given later win
    args = bench_hcdlm.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    models = [m for m in args.models.split(",") if m]
    if mine.from_results:
        saved = read_json(args.out / "sudoku_results.json", "bench_hcdlm results")
        out = {"results": saved["models"], "plot": str(args.out / "sudoku_accuracy_vs_steps.png"), "timing": {}}
        out["steps_list"] = [row["steps"] for row in next(iter(saved["models"].values()))["curve"]]
    else:
        out = bench_hcdlm.bench_task("sudoku", models, args)
    body = bench_hcdlm.render("sudoku", out, args)
    run = load_run(args.out / "sudoku" / "ccdd", device="cpu")
    if mine.probe_n is not None:
        args.val_n = mine.probe_n
    val = bench_hcdlm.eval_examples("sudoku", run, args, "validation")
    rows = [[mode] + [f"{100 * v:.1f}" for v in _pair(probe(run, val, mode))] for mode in PROBES]
    body += (
        f"\n\nWhich chain carries the solution (CCDD, validation boards, {len(val)}; 50 steps, margin order):\n\n"
        + table(["embedding input at each step", "boards %", "blank cells %"], rows)
    )
    report(
        f"CCDD on 6x6 Sudoku ({args.minutes:g} {args.clock}-minutes of training, hidden {args.hidden})",
        body,
        question="hcdlm_ccdd",
        figures={"tables": markdown_tables(body), "minutes": args.minutes, "models": models},
    )
    return 0


def _pair(scores: dict) -> tuple[float, float]:
    return scores["accuracy"], scores["blank_cells"]


if __name__ == "__main__":
    sys.exit(main())

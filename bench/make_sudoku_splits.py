"""Write frozen Sudoku validation and test files apart from the training pools of the seeds that will be trained.

The pools are the trainer's: ``generate_pool(geo, --pool, --difficulty, seed)`` for each of ``--train-seeds``, the
same call a run with ``--sudoku-pool POOL --seed SEED`` makes (its run directory caches it as puzzle_pool.json).
Each split holds ``--per-level`` easy (singles) and hard puzzles drawn from ``--generator-seed`` by
``draw_splits``, apart from those pools and from each other up to the training symmetries. Written to ``--out``:
validation.csv, test.csv (``puzzle,solution,level``, what ``examples_from_file`` reads) and splits.json (the
generator seed, the pools excluded, and per split its ``split_hash``, file sha256 and sizes).

``--kaggle FILE --kaggle-rows START:STOP`` also writes test_kaggle.csv: rows START..STOP-1 of every level of a
rated-puzzle file (``sudoku_kaggle3m_curated5000.csv``, whose rows 0-199 of each level are the test and
validation rows of the older 9x9 records of ``bench_hcdlm.py``),
checked apart from the pools and the generated splits; the manifest names the source file's sha256 and the rows.

    python bench/make_sudoku_splits.py --out bench/data/sudoku6 --generator-seed 2026 --per-level 150 \\
        --train-seeds 0,1,2 [--sudoku-box 2x3] [--pool 3000] [--difficulty singles] \\
        [--kaggle ../shared/data/sudoku_kaggle3m_curated5000.csv --kaggle-rows 200:230]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from dihal_fast.errors import DihalValueError
from dihal_fast.hcdlm.api import file_sha256
from dihal_fast.tasks.data import load_sudoku_csv
from dihal_fast.tasks.sudoku import geometry
from dihal_fast.tasks.sudoku_splits import LEVELS, Pair, check_disjoint, draw_splits, split_hash, write_split_csv
from dihal_fast.tasks.sudoku_task import generate_pool, parse_box


def kaggle_rows(path: str, window: str) -> list[tuple[Pair, str]]:
    """Rows ``START:STOP`` of every level of a rated-puzzle CSV, as ``((puzzle, solution), level)``."""
    start, sep, stop = window.partition(":")
    if not (sep and start.isdigit() and stop.isdigit() and int(start) < int(stop)):
        raise SystemExit(f"--kaggle-rows takes START:STOP with START < STOP, got {window!r}")
    by_level: dict[str, list[tuple[Pair, str]]] = {}
    try:
        records = load_sudoku_csv(path)
    except (OSError, DihalValueError) as exc:
        raise SystemExit(f"--kaggle {path}: {exc}") from None
    for record in records:
        by_level.setdefault(record.level, []).append(((tuple(record.puzzle), tuple(record.solution)), record.level))
    short = {level: len(rows) for level, rows in by_level.items() if len(rows) < int(stop)}
    if short:
        raise SystemExit(f"{path}: fewer rows than --kaggle-rows {window} asks for in {short}")
    return [row for rows in by_level.values() for row in rows[int(start) : int(stop)]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for validation.csv, test.csv and splits.json")
    parser.add_argument("--generator-seed", type=int, required=True)
    parser.add_argument("--per-level", type=int, default=150, help="puzzles per level (easy, hard) per split")
    parser.add_argument("--train-seeds", default="0,1,2", help="the training seeds whose pools are excluded")
    parser.add_argument("--sudoku-box", default="2x3")
    parser.add_argument("--pool", type=int, default=3000, help="the trainer's --sudoku-pool")
    parser.add_argument("--difficulty", default="singles", help="the trainer's --sudoku-difficulty")
    parser.add_argument("--kaggle", help="a rated-puzzle CSV (puzzle, solution, level) for test_kaggle.csv")
    parser.add_argument("--kaggle-rows", default="200:230", help="START:STOP, the rows of each level to take")
    args = parser.parse_args()
    kaggle = kaggle_rows(args.kaggle, args.kaggle_rows) if args.kaggle else None  # refused before the pools
    geo = geometry(*parse_box(args.sudoku_box))
    seeds = [int(s) for s in args.train_seeds.split(",")]
    pools = {seed: generate_pool(geo, args.pool, args.difficulty, seed) for seed in seeds}
    pooled = [pair for pool in pools.values() for pair in pool]  # the pools may share puzzles: they are all training
    splits = draw_splits(geo, args.generator_seed, args.per_level, pooled)
    if kaggle:
        splits["test_kaggle"] = kaggle
    check_disjoint(
        {"training pools": pooled, **{name: [pair for pair, _ in rows] for name, rows in splits.items()}}, geo
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict = {
        "generator_seed": args.generator_seed,
        "grid": f"{geo.n}x{geo.n}",
        "excluded_pools": {"train_seeds": seeds, "pool": args.pool, "difficulty": args.difficulty},
        "levels": LEVELS,
        "splits": {},
    }
    for name in splits:
        path = out / f"{name}.csv"
        write_split_csv(path, splits[name])
        manifest["splits"][name] = {
            "file": path.name,
            "split_hash": split_hash(pair for pair, _ in splits[name]),
            "sha256": file_sha256(path),
            "sizes": dict(Counter(level for _, level in splits[name])),  # levels in order of appearance
        }
    if args.kaggle:
        manifest["splits"]["test_kaggle"]["source"] = {"sha256": file_sha256(args.kaggle), "rows": args.kaggle_rows}
    (out / "splits.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(manifest["splits"], indent=1))


if __name__ == "__main__":
    main()

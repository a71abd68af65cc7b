"""Where does a locate pass spend its time? NVTX ranges of ``dihal locate`` on a small run.

Runs ``dihal locate`` (collection of every layer's hidden states, then the geometry proxies per
layer on repeated subsamples) on the shipped backbone or --model. When Nsight Systems (``nsys``) is
on the PATH the pass runs under it (CUDA + NVTX trace, report in --out) and its NVTX summary is
printed; otherwise the script times the same ``dihal/<stage>`` ranges itself
(:func:`dihal_fast.profiling.record_ranges`, CUDA-synchronised at range edges). The table and the
command are written as the record of bench/README.md's NVTX section (bench/results/locate_nvtx.json).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import report  # noqa: E402


def locate_argv(args: argparse.Namespace, out: Path) -> list[str]:
    argv = [
        "locate",
        "--out",
        str(out / "run"),
        "--max-tokens",
        str(args.max_tokens),
        "--repeats",
        str(args.repeats),
        "--sample-size",
        str(args.sample_size),
        "--n-pairs",
        str(args.n_pairs),
        "--backend",
        args.backend,
        "--device",
        args.device,
    ]
    return argv + (["--model", args.model] if args.model else [])


def run_under_nsys(args: argparse.Namespace, out: Path) -> str:
    """Profile this script (without nsys) under nsys and return its NVTX range summary."""
    profile = out / "locate"
    child = [sys.executable, str(Path(__file__).resolve()), "--no-nsys", "--no-report", "--out", str(out)]
    child += [a for a in sys.argv[1:] if a not in ("--no-nsys", "--no-report")]
    subprocess.run(
        ["nsys", "profile", "--trace=cuda,nvtx,osrt", "--force-overwrite=true", "-o", str(profile), *child], check=True
    )
    stats = subprocess.run(
        ["nsys", "stats", "--report", "nvtx_sum", "--format", "table", f"{profile}.nsys-rep"],
        check=True,
        capture_output=True,
        text=True,
    )
    return f"nsys report: {profile}.nsys-rep\n\n```\n{stats.stdout.strip()}\n```"


def run_self_timed(args: argparse.Namespace, out: Path) -> str:
    from dihal_fast.cli import main as dihal_main
    from dihal_fast.profiling import record_ranges

    with record_ranges() as timings:
        status = dihal_main(locate_argv(args, out))
    if status != 0:
        raise SystemExit(f"dihal locate exited with status {status}")
    return "self-timed (no nsys on the PATH), CUDA-synchronised at range edges\n\n```\n" + timings.table() + "\n```"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default=None, help="causal-LM checkpoint directory (default: the shipped backbone)")
    parser.add_argument("--max-tokens", type=int, default=8192, help="tokens streamed through the model")
    parser.add_argument("--repeats", type=int, default=3, help="subsamples per layer")
    parser.add_argument("--sample-size", type=int, default=1000, help="tokens per subsample")
    parser.add_argument("--n-pairs", type=int, default=2000, help="pairs for the monotonicity proxy")
    parser.add_argument("--backend", default="auto", help="geometry backend (auto, cpu, cuda, cuvs)")
    parser.add_argument("--device", default="auto", help="model device (auto, cpu, cuda)")
    parser.add_argument("--out", default=None, help="folder for the run and the nsys report (default: a temporary one)")
    parser.add_argument("--no-nsys", action="store_true", help="time the ranges in-process even if nsys is available")
    parser.add_argument(
        "--no-report", action="store_true", help="print only; do not write bench/results/locate_nvtx.json"
    )
    args = parser.parse_args()

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="dihal_profile_"))
    out.mkdir(parents=True, exist_ok=True)
    body = run_self_timed(args, out) if args.no_nsys or not shutil.which("nsys") else run_under_nsys(args, out)
    if args.no_report:
        print(body)
    else:
        report("NVTX ranges of a locate pass", body, question="locate_nvtx")
    return 0


if __name__ == "__main__":
    sys.exit(main())

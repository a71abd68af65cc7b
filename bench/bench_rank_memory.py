"""How much memory does each rank of a DeepSpeed bridge training hold, with the hybrid's frozen retained layers
sharing the teacher's tensors against a copy of them?

Runs ``train_bridge`` on the shipped backbone under ``torchrun --nproc_per_node 2`` (ZeRO-2, gloo on CPU) twice:
as shipped (``HybridLM.from_backbone`` loads the retained layers with ``assign``, so they reference the teacher's
tensors) and with that load forced to copy (``--copy``, what earlier versions did). Per rank: the bytes of every
distinct parameter storage alive after step 2 (teacher, hybrid, bridge) and the peak RSS (``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

LAYER, STEPS = 4, 3


def _worker(out: str, ds_config: str, copy: bool) -> None:
    """One rank: train, then print its figures as one JSON line."""
    from torch import nn

    if copy:
        load = nn.Module.load_state_dict
        nn.Module.load_state_dict = lambda self, state, strict=True, assign=False: load(
            self, state, strict=strict, assign=False
        )
    from dihal_fast.backbone import default_corpus
    from dihal_fast.replace import BridgeTrainConfig, train_bridge

    figures: dict[str, float] = {}

    def measure(info) -> None:
        if info.step == 2:
            storages = {
                p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                for p in gc.get_objects()
                if isinstance(p, nn.Parameter)
            }
            figures["parameter_storage_mb"] = sum(storages.values()) / 2**20

    config = BridgeTrainConfig(
        seq_len=64, batch_size=2, val_blocks=2, stats_blocks=4, steps=STEPS, log_every=1, checkpoint_every=10
    )
    train_bridge(None, LAYER, default_corpus(), out, config, deepspeed_config=ds_config, callback=measure)
    figures["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("FIGURES " + json.dumps({"rank": int(os.environ.get("RANK", "0")), **figures}), flush=True)


def _run(copy: bool, workdir: Path) -> list[dict]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (workdir / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    out = workdir / ("copy" if copy else "shared")
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [
        str(torchrun),
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        __file__,
        "--worker",
        str(out),
        str(workdir / "ds.json"),
        *(["--copy"] if copy else []),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    rows = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("FIGURES ")]
    return sorted(rows, key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("OUT", "DS_CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--copy", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(*args.worker, copy=args.copy)
        return
    from _common import report, rows_figure

    with tempfile.TemporaryDirectory() as tmp:
        results = {"copy": _run(True, Path(tmp)), "shared": _run(False, Path(tmp))}
    header = ["retained layers", "rank", "parameter storage MB", "peak RSS MB"]
    rows = [
        [mode, r["rank"], round(r["parameter_storage_mb"], 2), round(r["peak_rss_mb"], 1)]
        for mode, ranks in results.items()
        for r in ranks
    ]
    body = (
        "| "
        + " | ".join(header)
        + " |\n| --- | --- | --- | --- |\n"
        + "\n".join("| " + " | ".join(str(c) for c in row) + " |" for row in rows)
    )
    body += (
        f"\n\nShipped backbone, `replace --layer {LAYER}`, {STEPS} steps, ZeRO-2, 2 gloo processes on CPU; "
        "'copy' forces the copying load of earlier versions."
    )
    report(
        "Memory per rank of bridge training: shared against copied retained layers",
        body,
        question="rank_memory",
        figures={"per_rank": rows_figure(header, rows)},
    )


if __name__ == "__main__":
    main()

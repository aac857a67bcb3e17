"""Distributed SWAG on torch.distributed: speed-up of 2 processes over 1, and memory per rank.

(a) The default ``dswag`` trajectory (params.yaml) on mnist5k with LeNet-5,
    run on 1 and on 2 processes at their default thread counts (1 thread per
    process and rank since 66c2895, 2 on 1 process before: never more threads
    than cores)
    through the same launcher the pipeline uses (torchrun via
    ``bayesavg.runtime.launch``); a configuration that would oversubscribe the
    usable cores is named in a warning first. The time is that of ``run_dswag`` on
    rank 0 once every rank has joined (training, gathering, evaluating); the
    whole process (torch imports, data, rendezvous) is reported too.
    Runs alternate 1, 2, 2, 1, ... so load drift hits both alike; the
    posterior's sha256 on 2 processes must be that of 1 process run with the
    ranks' one thread (``BAYESAVG_THREADS=1``), one more run. Beside them, the
    machine's own ceiling: a fixed single-thread workload in one process
    against two copies side by side (2.0 on two free cores; a VM whose two
    vCPUs share a core or a quota gives less, and no 2-process run can beat it).
(b) 1,000 logical clients on 2 processes against 100: how much more each
    rank's RSS grows during the run, in units of the model's size (4 d
    bytes). Memory O(W d) would add ~900 model sizes per copy kept; the
    design keeps O(d (K + clients in flight)), so ~0.

Run ``python benchmarks/dswag.py [--repeats 3] [--out FILE]``; results go to
``benchmarks/dswag.json``. Nothing is asserted; targets are printed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from timing import Stopwatch, median_range, rotation, write_results

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent / "dswag.json"


def job(args: argparse.Namespace) -> None:
    """One rank (or the only process): run DSWAG and let rank 0 write what it measured."""
    import resource

    import torch

    from bayesavg.config import load_params
    from bayesavg.data.prepared import prepare
    from bayesavg.dswag.rounds import run_dswag
    from bayesavg.models import build_model
    from bayesavg.posteriors.file import save_posterior
    from bayesavg.runtime import numerics
    from bayesavg.runtime.io import write_text
    from bayesavg.seeding import seed_everything
    from bayesavg.training.distributed import join
    from bayesavg.trajectories import posterior_fields
    from bayesavg.trajectories.common import watched

    torch.set_num_threads(numerics.threads())  # the data's statistics too: same on every count
    p = load_params(ROOT / "params.yaml")
    traj = p.finetune["dswag"]
    if args.clients:  # the memory runs (both client counts): one step each, one round
        phase1 = traj.phase1.model_copy(update={"rounds": 1})
        phase2 = traj.phase2.model_copy(update={"epochs": 1, "snapshots_per_client": 1})
        update = {"clients": args.clients, "phase1": phase1, "phase2": phase2, "batch_size": 8}
        traj = traj.model_copy(update=update)
    with tempfile.TemporaryDirectory() as tmp:
        d = p.data
        prepared = prepare(d.dataset, d.raw_dir, tmp, p.seed, d.test_fraction, d.val_fraction)
    device = torch.device("cpu")
    splits = {s: watched(getattr(prepared, s), prepared, device) for s in ("train", "val", "test")}
    seed_everything(p.seed, device)
    kwargs = p.model.kwargs()
    net = build_model(p.model.name, prepared.input_shape, prepared.num_classes, kwargs)
    fields = posterior_fields(p, prepared, "dswag", kwargs)
    join(device)  # the rendezvous (waiting for the other ranks' start-up) is not timed
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with Stopwatch() as watch:
        out = run_dswag(p.seed, "dswag", traj, net, splits, prepared.train.y, fields)
    rank = int(os.environ.get("RANK", "0"))
    record: dict[str, Any] = {
        "rank": rank,
        "seconds": watch.seconds,
        "rss_before_kib": rss_before,
        "rss_peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "model_bytes": 4 * sum(q.numel() for q in net.parameters()),
    }
    if out is not None:
        path = Path(f"{args.result}.pt")
        save_posterior(path, out[0])
        record["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        record["snapshots"] = out[0].collector["n_collected"]
    write_text(f"{args.result}.rank{rank}.json", json.dumps(record))


def _steps(_: int) -> float:
    """A fixed single-thread workload (LeNet-5 training steps); its wall time."""
    import torch

    from bayesavg.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = build_model("lenet5", (1, 28, 28), 10, {})
    x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    with Stopwatch() as watch:
        for _ in range(400):
            torch.nn.functional.cross_entropy(net(x), y).backward()
    return watch.seconds


def ceiling(pool1: Any, pool2: Any) -> float:
    """What this machine gives two independent single-thread processes: 2 t1 / t2 for the
    same workload alone and side by side (2.0 on two free cores)."""
    alone = pool1.map(_steps, [0])[0]
    together = max(pool2.map(_steps, [0, 1]))
    return 2 * alone / together


def launch_job(
    nproc: int, clients: int | None, tmp: Path, threads: str | None = None
) -> dict[str, Any]:
    """Run ``job`` on ``nproc`` processes at the default thread count, or ``threads``;
    return rank records and the whole wall time."""
    result = tmp / f"n{nproc}-c{clients}-{time.monotonic_ns()}"
    env = {k: v for k, v in os.environ.items() if k != "BAYESAVG_THREADS"}
    env["BAYESAVG_NPROC"] = str(nproc)
    if threads is not None:
        env["BAYESAVG_THREADS"] = threads
    cmd = [sys.executable, __file__, "--job", "--result", str(result)]
    cmd += ["--clients", str(clients)] if clients else []
    with Stopwatch() as watch:
        subprocess.run(cmd, env=env, check=True, cwd=ROOT)
    ranks = [json.loads((tmp / f"{result.name}.rank{r}.json").read_text()) for r in range(nproc)]
    return {"wall": watch.seconds, "ranks": ranks}


def main() -> None:
    from bayesavg.runtime import numerics

    # As every entry point: the thread count and instruction set before torch, here and
    # in the jobs (a 1-process job is never relaunched, which would pin it)
    numerics.pin()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--memory-clients", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=OUT, help="results JSON path")
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        from bayesavg.runtime import launch

        if launch.should_relaunch():
            launch.relaunch([__file__, *sys.argv[1:]])
        else:
            code = launch.rank_entry(lambda: job(args))
            if code:
                sys.exit(code)
        return

    for n in (1, 2):
        crowded = numerics.oversubscribed(
            n, {k: v for k, v in os.environ.items() if k != "BAYESAVG_THREADS"}
        )
        if crowded is not None:
            print(f"warning: {crowded}", flush=True)
    ctx = multiprocessing.get_context("spawn")
    with (
        tempfile.TemporaryDirectory() as tmp_name,
        ctx.Pool(1) as pool1,
        ctx.Pool(2) as pool2,
    ):
        tmp = Path(tmp_name)
        runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
        ceilings = []
        for i in range(args.repeats):
            ceilings.append(ceiling(pool1, pool2))
            print(f"  independent work, 2 processes vs 1: {ceilings[-1]:.2f}x", flush=True)
            for n in rotation((1, 2), i):  # 1, 2, 2, 1, ...: load drift hits both alike
                runs[n].append(launch_job(n, None, tmp))
                print(f"  {n} process(es): {runs[n][-1]['ranks'][0]['seconds']:.1f} s", flush=True)
        one_thread = launch_job(1, None, tmp, threads="1")
        few = launch_job(2, args.memory_clients // 10, tmp)
        memory = launch_job(2, args.memory_clients, tmp)
    compute = {n: [r["ranks"][0]["seconds"] for r in rs] for n, rs in runs.items()}
    wall = {n: [r["wall"] for r in rs] for n, rs in runs.items()}
    hashes = {r["ranks"][0]["sha256"] for r in runs[2]} | {one_thread["ranks"][0]["sha256"]}
    default_one = {r["ranks"][0]["sha256"] for r in runs[1]}
    model_bytes = memory["ranks"][0]["model_bytes"]

    def growth(r: dict[str, Any]) -> float:
        return (r["rss_peak_kib"] - r["rss_before_kib"]) / 1024

    per_rank = [
        {
            "rank": r["rank"],
            "peak_rss_mib": r["rss_peak_kib"] / 1024,
            "growth_mib": (r["rss_peak_kib"] - r["rss_before_kib"]) / 1024,
            "growth_mib_tenth_clients": (f["rss_peak_kib"] - f["rss_before_kib"]) / 1024,
            "extra_in_models": (
                (r["rss_peak_kib"] - r["rss_before_kib"])
                - (f["rss_peak_kib"] - f["rss_before_kib"])
            )
            * 1024
            / model_bytes,
        }
        for r, f in zip(memory["ranks"], few["ranks"], strict=True)
    ]
    ceiling_median, ceiling_low, ceiling_high = median_range(ceilings)
    results = {
        "repeats": args.repeats,
        "speedup_compute": statistics.median(compute[1]) / statistics.median(compute[2]),
        "machine_ceiling": ceiling_median,
        "machine_ceiling_range": [ceiling_low, ceiling_high],
        "speedup_wall": statistics.median(wall[1]) / statistics.median(wall[2]),
        "seconds_compute": compute,
        "seconds_wall": wall,
        "identical_posteriors": len(hashes) == 1,
        "same_bytes_at_the_defaults": len(hashes | default_one) == 1,
        "threads": {"1": numerics.threads({}), "2": numerics.threads({"WORLD_SIZE": "2"})},
        "memory": {
            "clients": args.memory_clients,
            "model_mib": model_bytes / 2**20,
            "snapshots": memory["ranks"][0]["snapshots"],
            "per_rank": per_rank,
        },
        "cpu_count": os.cpu_count(),
    }
    write_results(args.out, results)
    print(
        f"DSWAG (the default trajectory): 2 processes vs 1 (default threads: "
        f"{results['threads']['2']} per rank, {results['threads']['1']} on 1 process): "
        f"{results['speedup_compute']:.2f}x in run_dswag, {results['speedup_wall']:.2f}x whole "
        f"process (target >= 1.6x); 2 processes' posterior = 1 process at BAYESAVG_THREADS=1: "
        f"{results['identical_posteriors']}"
    )
    print(
        f"this machine, two independent single-thread processes vs one: "
        f"{results['machine_ceiling']:.2f}x (2.0 on two free cores; range "
        f"{ceiling_low:.2f}-{ceiling_high:.2f}): the most any 2-process run can gain here"
    )
    for r in per_rank:
        print(
            f"{args.memory_clients} clients, rank {r['rank']}: "
            f"peak RSS {r['peak_rss_mib']:.0f} MiB; "
            f"growth during the run {r['growth_mib']:.0f} MiB "
            f"vs {r['growth_mib_tenth_clients']:.0f} MiB with a tenth of the clients: "
            f"{r['extra_in_models']:.0f} model sizes more for {9 * args.memory_clients // 10} more "
            f"clients (model {results['memory']['model_mib']:.2f} MiB)"
        )


if __name__ == "__main__":
    main()

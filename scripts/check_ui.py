"""Look at the MLflow UI as a user does: start ``mlflow ui`` on 127.0.0.1 over this
repository's store, open the experiment's runs and one evaluate run in headless
Chromium, and save screenshots. With ``--uri`` of a tracking server (``mlflow server``
serves the UI too), its pages instead: no UI of our own is started.

    python scripts/check_ui.py [OUT_DIR] [--uri http://host:port]   # default: reports/ui

Prints where each screenshot went, and, from the store itself, what those pages show:
runs grouped under pipeline executions, Source, User, Datasets and Logged models.
Exit 2 without a store or a browser.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ui_server
from check_report import INSTALL_HINT, find_browser

ROOT = Path(__file__).resolve().parents[1]
USAGE = "python scripts/check_ui.py [OUT_DIR] [--uri http://host:port]"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, server: subprocess.Popen[bytes], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while True:
        if server.poll() is not None:
            raise SystemExit(f"mlflow ui exited with code {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"mlflow ui did not answer in {seconds:.0f} s") from None
            time.sleep(0.5)


def _shot(browser: str, url: str, out: Path, height: int = 1100) -> None:
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size=1600,{height}",
            "--virtual-time-budget=20000",
            f"--screenshot={out}",
            url,
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )


def _shoot(browser: str, base: str, exp_id: str, run_id: str, out: Path) -> None:
    """Screenshots of the runs, one evaluate run and the logged models."""
    pages = {
        "runs.png": f"{base}/#/experiments/{exp_id}/runs?workflowType=machine_learning",
        "run.png": f"{base}/#/experiments/{exp_id}/runs/{run_id}?workflowType=machine_learning",
        "models.png": f"{base}/#/experiments/{exp_id}/models?workflowType=machine_learning",
    }
    for name, url in pages.items():
        _shot(browser, url, out / name)
        print(f"{out / name}: {url}")


def _summary(uri: str, experiment: str) -> tuple[str, str, list[str]]:
    """The experiment id, an evaluate run to open, and what the pages should show."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"no experiment {experiment!r} in {uri}: run `make run` first")
    runs = client.search_runs([exp.experiment_id], max_results=5000)
    parents = [r for r in runs if "bayesavg.execution" in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    evaluate = [r for r in children if r.info.run_name.startswith("evaluate@")]
    if not evaluate:
        raise SystemExit("no evaluate run with a parent: run `make run` with this version")
    run = evaluate[0]
    lines = [
        f"experiment kind: {exp.tags.get('mlflow.experimentKind')}",
        f"{len(parents)} pipeline execution(s) (parent runs) holding {len(children)} stage runs",
        f"{run.info.run_name}: Source {run.data.tags.get('mlflow.source.name')}, "
        f"User {run.data.tags.get('mlflow.user')}, datasets "
        + ", ".join(d.dataset.name for d in run.inputs.dataset_inputs)
        + f"; logged models {[o.model_id for o in run.outputs.model_outputs]}",
    ]
    for model in client.search_registered_models():
        aliases = ", ".join(f"{a} -> v{v}" for a, v in model.aliases.items())
        lines.append(f"registered model {model.name} ({aliases or 'no alias'})")
    # what an outage must not leave behind (issue 30): a run RUNNING forever, a
    # placeholder id in place of a run's
    stuck = [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    if stuck:
        raise SystemExit(f"runs left RUNNING: {', '.join(sorted(stuck))}")
    spooled = [
        f"{r.info.run_name}: {k}"
        for r in runs
        for k, v in r.data.tags.items()
        if v.startswith("spooled:")
    ]
    if spooled:
        raise SystemExit(f"placeholder run ids in tags: {'; '.join(spooled)}")
    return exp.experiment_id, run.info.run_id, lines


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], allow_abbrev=False, usage=USAGE
    )
    parser.add_argument("out", nargs="?", type=Path, default=ROOT / "reports" / "ui")
    parser.add_argument("--uri", default=None, help="a tracking server's URL (default: ours)")
    args = parser.parse_args(argv)
    server_uri, out = args.uri, args.out
    browser = find_browser()
    if browser is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    if server_uri is not None:
        exp_id, run_id, lines = _summary(server_uri, "bayesavg")
        out.mkdir(parents=True, exist_ok=True)
        _shoot(browser, server_uri.rstrip("/"), exp_id, run_id, out)
        for line in lines:
            print(line)
        return 0
    store = ROOT / "mlflow.db"
    if not store.is_file():
        print(f"no MLflow store at {store}: run `make run` first", file=sys.stderr)
        return 2
    uri = f"sqlite:///{store}"
    exp_id, run_id, lines = _summary(uri, "bayesavg")
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    server = subprocess.Popen(
        ui_server.command(uri, ROOT / "mlartifacts", port),
        env=ui_server.environ(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(f"{base}/health", server)
        _shoot(browser, base, exp_id, run_id, out)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

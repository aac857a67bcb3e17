"""Posteriors as MLflow models: the pyfunc round trip, no pickle, the registry, and a real
`mlflow models serve` answering HTTP with the probabilities `bayesavg.evaluation.evaluate` gives."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from bayesavg.evaluation.evaluate import evaluate
from bayesavg.posteriors.file import load_posterior
from bayesavg.predict import MODEL_CODE
from bayesavg.runtime.io import sha256_file
from bayesavg.tracking.registry import register_best
from bayesavg.tracking.store import open_run

if TYPE_CHECKING:
    from conftest import PreparedDir, TinyPosteriors

BIN = Path(sys.executable).parent
CONFIG = {"method": "swag", "scale": 0.5, "n_samples": 7, "seed": 3, "batch_size": 64}


def _images(prepared: PreparedDir, n: int = 6) -> np.ndarray:
    return prepared.prepared.test.x[:n].numpy()


def _expected(posterior: Path, images: np.ndarray) -> np.ndarray:
    """What ``bayesavg evaluate`` computes for these images: evaluate() with the seed."""
    post = load_posterior(posterior)
    x = post.model_input(torch.as_tensor(images))
    found = evaluate(
        post,
        CONFIG["method"],
        {"test": (x, torch.zeros(len(images)).long())},
        n_samples=CONFIG["n_samples"],
        scale=CONFIG["scale"],
        batch_size=CONFIG["batch_size"],
        seed=CONFIG["seed"],
    )
    return found["test"].log_probs.exp().numpy()


def _log(
    store: tuple[str, str], posterior: Path, images: np.ndarray, stored: bool
) -> tuple[str, str]:
    """A run that logs the model into ``store`` (``mlflow_store``'s); with ``stored`` an
    earlier run already holds the posterior (as the finetune stage's artifact), so the
    model points at it instead of copying it."""
    uri, artifacts = store
    digest = sha256_file(posterior)
    if stored:
        for _ in range(2):  # a forced rerun with the same bytes stores nothing more
            trainer = open_run("finetune@swag", tracking_uri=uri, artifact_location=artifacts)
            stored = trainer.log_artifact_once(posterior, "posterior", digest)
            trainer.terminate()
        first = stored.split("/")[1]
        assert stored == f"runs:/{first}/posterior/posterior.pt"
        root = Path(urlparse(artifacts).path).parent
        assert len(list(root.rglob("posterior.pt"))) == 1 + 1, "the model dir's source + one"
    run = open_run("evaluate@swag", tracking_uri=uri, artifact_location=artifacts)
    post = load_posterior(posterior)
    model_id = run.log_model(
        name="swag",
        posterior=str(posterior),
        digest=digest,
        config=CONFIG,
        input_shape=post.input_shape,
        num_classes=post.num_classes,
        example=images[:2].tolist(),
        code=str(MODEL_CODE),
    )
    run.terminate()
    return uri, model_id


@pytest.fixture
def posterior(tmp_path: Path, tiny_posteriors: TinyPosteriors) -> Path:
    """The SWAG posterior under the name the finetune stage logs it by."""
    path = tmp_path / "models" / "swag" / "posterior.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(tiny_posteriors.swag.read_bytes())
    return path


@pytest.mark.parametrize("stored", [False, True])
def test_pyfunc_round_trip_gives_evaluates_probabilities(
    tmp_path: Path,
    mlflow_store: tuple[str, str],
    posterior: Path,
    mnist5k_prepared: PreparedDir,
    stored: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """... and leaves nothing in the temporary folder: loading a model whose posterior
    another run stores downloaded it into a new folder there on every load."""
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    images = _images(mnist5k_prepared)
    uri, model_id = _log(mlflow_store, posterior, images, stored)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(tracking_uri=uri)
    model = client.get_logged_model(model_id)
    assert model.status == "READY" or str(model.status).endswith("READY")
    files = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    in_model = [f for f in files if f"/{model_id}/" in f]
    assert not any(f.endswith((".pkl", ".pickle")) for f in in_model), "no pickle in the model"
    assert any(f.endswith("mlflow_model.py") for f in in_model), "the model is logged as code"
    assert any(f.endswith("posterior.pt") for f in in_model) is not stored
    loaded = mlflow.pyfunc.load_model(f"models:/{model_id}")
    out = loaded.predict(images)
    expected = _expected(posterior, images)
    np.testing.assert_allclose(out["probabilities"], expected, rtol=0, atol=1e-12)
    assert np.array_equal(out["predicted_class"], expected.argmax(1))
    entropy = -(expected * np.log(expected)).sum(1)
    np.testing.assert_allclose(out["entropy"], entropy, atol=1e-9)
    assert sorted(p.name for p in scratch.rglob("*")) == []
    assert (out["mutual_info"] >= 0).all() and (out["mutual_info"] <= out["entropy"] + 1e-12).all()
    signature = loaded.metadata.signature
    assert signature.inputs.inputs[0].shape == (-1, 1, 28, 28)
    assert [s.name for s in signature.outputs.inputs] == [
        "probabilities",
        "predicted_class",
        "entropy",
        "mutual_info",
    ]
    run = client.get_run(model.source_run_id)
    assert [o.model_id for o in run.outputs.model_outputs] == [model_id]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


@pytest.mark.slow  # ~15 s: `mlflow models serve` starts a scoring server
def test_registered_best_model_is_served_over_http(
    tmp_path: Path, mlflow_store: tuple[str, str], posterior: Path, mnist5k_prepared: PreparedDir
) -> None:
    images = _images(mnist5k_prepared)
    uri, model_id = _log(mlflow_store, posterior, images, stored=True)
    name = "bayesavg-test"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.get_logged_model(model_id).source_run_id
    candidates = {"swag": {"run_id": run_id, "val_nll": 0.1}}
    assert register_best(client, uri, name, candidates) == "1"
    assert register_best(client, uri, name, candidates) == "1", "same model: no new version"
    assert str(client.get_model_version_by_alias(name, "champion").version) == "1"
    assert "swag: models:/" in client.get_registered_model(name).description
    port = _free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": f"{BIN}:{os.environ['PATH']}"}
    server = subprocess.Popen(
        [
            str(BIN / "mlflow"),
            "models",
            "serve",
            "-m",
            f"models:/{name}/latest",
            "--env-manager",
            "local",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the model server did not start in 180 s"
                time.sleep(0.5)
        answer = _post(f"http://127.0.0.1:{port}/invocations", {"inputs": images.tolist()})
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    got = np.asarray(answer["predictions"]["probabilities"])
    np.testing.assert_allclose(got, _expected(posterior, images), rtol=0, atol=1e-12)
    assert answer["predictions"]["predicted_class"] == got.argmax(1).tolist()


def test_a_batchnorm_posterior_is_served_with_its_logged_training_images(
    tmp_path: Path, mnist5k_prepared: PreparedDir
) -> None:
    """SWAG on a BatchNorm network recomputes the statistics of each drawn network on
    training images: the served model reads them from its ``bn_images`` artifact and
    predicts what a ``Predictor`` given those images does (without them it cannot)."""
    import dataclasses
    from types import SimpleNamespace

    from bayesavg.mlflow_model import PosteriorModel
    from bayesavg.models import build_model
    from bayesavg.posteriors.file import PosteriorFile, save_posterior
    from bayesavg.posteriors.swag import SWAG
    from bayesavg.predict import Predictor, PredictorConfig

    prepared = mnist5k_prepared.prepared
    torch.manual_seed(0)
    model = build_model(
        "mlp", prepared.input_shape, prepared.num_classes, {"hidden": [16], "batch_norm": True}
    )
    base = PosteriorFile.from_model(
        model,
        trajectory="swag",
        model_name="mlp",
        model_kwargs={"hidden": [16], "batch_norm": True},
        input_shape=prepared.input_shape,
        mean=prepared.manifest["mean"],
        std=prepared.manifest["std"],
        num_classes=prepared.num_classes,
        data={"dataset": "mnist5k", "seed": 0, "test_fraction": 0.2, "val_fraction": 0.1},
    )
    swag = SWAG(base.theta.numel(), max_rank=2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        swag.collect(base.theta + 0.05 * torch.randn(base.theta.shape, generator=gen))
    path = tmp_path / "swag.pt"
    save_posterior(path, dataclasses.replace(base, collector=swag.state_dict()))
    bn = prepared.train.x[:64].clone()
    torch.save(bn, tmp_path / "bn_images.pt")
    served = PosteriorModel()
    served.load_context(
        SimpleNamespace(
            model_config=CONFIG,
            artifacts={"posterior": str(path), "bn_images": str(tmp_path / "bn_images.pt")},
        )
    )
    images = _images(mnist5k_prepared)
    direct = Predictor(path, PredictorConfig.from_mapping(CONFIG), bn)(images)
    got = served.predict(None, images)
    np.testing.assert_array_equal(got["probabilities"], direct["probabilities"])

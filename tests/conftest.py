"""Shared fixtures: mnist5k prepared once, tiny posterior files, image folders."""

from __future__ import annotations

from pathlib import Path

import pytest

import bayesavg

_SRC = Path(__file__).resolve().parents[1] / "src"
if Path(bayesavg.__file__).resolve().parent != _SRC / "bayesavg":
    # a venv whose editable install is another checkout's (shared or copied): every test
    # would pass or fail on that checkout's code, and say nothing
    pytest.exit(
        f"the tests import bayesavg from {Path(bayesavg.__file__).parent}, not from this "
        f"checkout ({_SRC / 'bayesavg'}): run `make install` here, or set PYTHONPATH={_SRC}"
    )

from bayesavg.runtime import numerics

numerics.pin()  # before torch, as every stage does: tests compute what the stages compute

import dataclasses
import shutil
import sys
from collections.abc import Callable, Iterator

import numpy as np
import torch
from PIL import Image
from torch import nn

from bayesavg.data.prepared import Prepared, prepare, to_input
from bayesavg.models import build_model
from bayesavg.posteriors import SWAG
from bayesavg.posteriors.file import PosteriorFile, save_posterior

MNIST5K_DATA = {"dataset": "mnist5k", "seed": 0, "test_fraction": 0.2, "val_fraction": 0.1}


@dataclasses.dataclass(frozen=True)
class PreparedDir:
    """What ``prepare`` returned and the directory it wrote to."""

    out_dir: Path
    prepared: Prepared


@dataclasses.dataclass(frozen=True)
class TinyPosteriors:
    """Posterior files of one small MLP trained on mnist5k, and the model itself."""

    plain: Path
    swag: Path
    model: nn.Module
    swag_rank: int


@pytest.fixture(scope="session")
def mnist5k_prepared(tmp_path_factory: pytest.TempPathFactory) -> PreparedDir:
    """mnist5k split with seed 0, 0.2 test, 0.1 val; done once since parsing the csv takes ~1 s."""
    root = tmp_path_factory.mktemp("mnist5k_seed0")
    out = root / "prepared"
    prepared = prepare(
        "mnist5k",
        root / "raw",
        out,
        MNIST5K_DATA["seed"],
        MNIST5K_DATA["test_fraction"],
        MNIST5K_DATA["val_fraction"],
    )
    return PreparedDir(out, prepared)


@pytest.fixture(scope="session")
def short_starts(mnist5k_prepared: PreparedDir) -> dict[str, PosteriorFile]:
    """The starts of the short runs of every trajectory kind (``pipeline_repo``'s
    ``small_params(epochs=2, pretrain_epochs=1, members=2)``): its two pretrained
    members, and, on first use, a trajectory another continues from (vi, fvi)."""
    from pipeline_repo import small_params

    from bayesavg.config import parse_params
    from bayesavg.trajectories import finetune, pretrain_members

    params = parse_params(small_params(epochs=2, pretrain_epochs=1, members=2))
    prepared, cpu = mnist5k_prepared.prepared, torch.device("cpu")

    class Starts(dict):
        """Another trajectory's posterior (fvi, which fhwa continues) on first use."""

        def __missing__(self, name: str) -> PosteriorFile:
            start = self[params.finetune[name].start]
            self[name] = finetune(params, name, prepared, start, cpu).posterior
            return self[name]

    starts = Starts(pretrain=pretrain_members(params, prepared, cpu).posterior)
    return starts


def _train_tiny_mlp(prepared: Prepared) -> nn.Module:
    """A few SGD epochs: enough for clearly better-than-chance accuracy in well under 1 s."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_model("mlp", prepared.input_shape, prepared.num_classes, {"hidden": [32]})
        x = to_input(prepared.train.x, prepared.manifest["mean"], prepared.manifest["std"])
        y = prepared.train.y
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for _ in range(3):
            for idx in torch.randperm(len(y)).split(100):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
    return model.eval()


@pytest.fixture(scope="session")
def tiny_posteriors(
    tmp_path_factory: pytest.TempPathFactory, mnist5k_prepared: PreparedDir
) -> TinyPosteriors:
    """One posterior file without a collector (map only) and one with a SWAG collector."""
    prepared = mnist5k_prepared.prepared
    model = _train_tiny_mlp(prepared)
    base = PosteriorFile.from_model(
        model,
        trajectory="pretrain",
        model_name="mlp",
        model_kwargs={"hidden": [32]},
        input_shape=prepared.input_shape,
        mean=prepared.manifest["mean"],
        std=prepared.manifest["std"],
        num_classes=prepared.num_classes,
        data=dict(MNIST5K_DATA),
    )
    rank = 5
    swag = SWAG(base.theta.numel(), max_rank=rank)
    gen = torch.Generator().manual_seed(0)
    for _ in range(rank + 1):
        swag.collect(base.theta + 0.05 * torch.randn(base.theta.shape, generator=gen))
    with_collector = dataclasses.replace(base, trajectory="swag", collector=swag.state_dict())
    root = tmp_path_factory.mktemp("tiny_posteriors")
    save_posterior(root / "pretrain.pt", base)
    save_posterior(root / "swag.pt", with_collector)
    return TinyPosteriors(root / "pretrain.pt", root / "swag.pt", model, rank)


ImageFolderFactory = Callable[..., Path]


@pytest.fixture
def imagefolder_factory(tmp_path: Path) -> ImageFolderFactory:
    """Build ``<tmp>/<name>/<label>/<i>.png``; every pixel of an image is 10 * label + i.

    The constant value lets a test check which folder an image's label came from.
    """

    def make(
        num_classes: int = 3,
        per_class: int = 2,
        mode: str = "RGB",
        size: tuple[int, int] = (12, 10),
        name: str = "images",
    ) -> Path:
        root = tmp_path / name
        for label in range(num_classes):
            folder = root / str(label)
            folder.mkdir(parents=True)
            for i in range(per_class):
                bands = 3 if mode == "RGB" else 1
                pixels = np.full((size[0], size[1], bands), 10 * label + i, dtype=np.uint8)
                Image.fromarray(pixels.squeeze(2) if bands == 1 else pixels).save(
                    folder / f"{i}.png"
                )
        return root

    return make


@pytest.fixture
def imagefolder(imagefolder_factory: ImageFolderFactory) -> Path:
    """Three classes of two 12x10 RGB images each."""
    return imagefolder_factory()


@pytest.fixture(scope="module")
def bn_swag_posterior(
    tmp_path_factory: pytest.TempPathFactory, mnist5k_prepared: PreparedDir
) -> Path:
    """A SWAG posterior of a small BatchNorm MLP trained a few steps on mnist5k (the CLI's
    tests: BatchNorm recomputed per sample, swa_ts's temperature fit)."""
    from bayesavg.data.prepared import to_input
    from bayesavg.models import build_model
    from bayesavg.posteriors.file import PosteriorFile, save_posterior
    from bayesavg.posteriors.swag import SWAG

    prepared = mnist5k_prepared.prepared
    kwargs = {"hidden": [16], "batch_norm": True}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_model("mlp", prepared.input_shape, prepared.num_classes, kwargs)
        x = to_input(prepared.train.x, prepared.manifest["mean"], prepared.manifest["std"])
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        swag = SWAG(sum(p.numel() for p in model.parameters()), max_rank=4)
        for idx in torch.randperm(len(x)).split(128):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), prepared.train.y[idx]).backward()
            opt.step()
            swag.collect(model)
    posterior = PosteriorFile.from_model(
        model,
        trajectory="swag",
        model_name="mlp",
        model_kwargs=kwargs,
        input_shape=prepared.input_shape,
        mean=prepared.manifest["mean"],
        std=prepared.manifest["std"],
        num_classes=prepared.num_classes,
        data=dict(MNIST5K_DATA),
        collector=swag.state_dict(),
    )
    path = tmp_path_factory.mktemp("bn") / "posterior.pt"
    save_posterior(path, posterior)
    return path


@pytest.fixture(scope="session")
def mlflow_tables(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow database with every table at the current schema and nothing in it.

    Creating the tables (MLflow's Alembic migrations) takes 1.5 s, about 80 times a run of
    the suite; a copy of this file takes none. It holds no experiment, not even the
    Default one, which the first store to open a copy creates with that store's artifact
    root, as it does on an empty database.
    """
    from mlflow.store.db.utils import _initialize_tables, create_sqlalchemy_engine_with_retry

    path = tmp_path_factory.mktemp("mlflow_tables") / "mlflow.db"
    engine = create_sqlalchemy_engine_with_retry(f"sqlite:///{path}")
    _initialize_tables(engine)
    engine.dispose()
    return path


@pytest.fixture
def mlflow_db(tmp_path: Path, mlflow_tables: Path) -> str:
    """The tracking URI of a fresh SQLite store, ``tmp_path / "mlflow.db"``: a copy of
    ``mlflow_tables``, the database a first use would create, less the wait."""
    shutil.copyfile(mlflow_tables, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def mlflow_store(tmp_path: Path, mlflow_db: str) -> tuple[str, str]:
    """A fresh MLflow store: its tracking URI and artifact location."""
    return mlflow_db, (tmp_path / "mlartifacts").as_uri()


@pytest.fixture(scope="module")
def forks_server() -> Iterator[dict[str, str]]:
    """``scripts/tracking_forks.py``'s server, running: the variables that lead a stage to it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import tracking_forks

    with tracking_forks.serving() as env:
        yield env

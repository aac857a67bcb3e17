"""A source bug the runtime mutation audit found, left unfixed on purpose: this test fails
until ``bayesavg.runtime.io._csv_cell`` is fixed.

``write_csv``'s docstring promises "floats in repr precision". A numpy float64 is a
``float`` (``isinstance`` holds), so ``_csv_cell`` writes ``repr(value)``, which numpy 2
spells ``np.float64(0.5)``: the cell is not a number, and a reader (DVC plots, pandas,
the report's own CSV reader) gets a string. No caller passes numpy scalars today (they
convert with ``.item()`` or ``float()``), so the bug is latent; a row built from a numpy
array would hit it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bayesavg.runtime.io import write_csv


def test_a_numpy_float_is_written_as_a_number(tmp_path: Path) -> None:
    target = tmp_path / "rows.csv"
    write_csv(target, [{"epoch": 1, "loss": np.float64(0.5)}])
    assert target.read_text() == "epoch,loss\n1,0.5\n"

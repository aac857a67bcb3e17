"""Model input made a batch at a time (``data.inputs``): every slice, row subset and chain
is bitwise what slicing the whole normalised split gives, so evaluation, the BatchNorm
pass and monitoring keep their bytes while a split is never whole as float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bayesavg.data.inputs import Chained, Inputs
from bayesavg.data.prepared import to_input
from bayesavg.data.storage import is_mapped, read_array

MEAN, STD = [0.2, 0.5, 0.7], [0.3, 0.25, 0.2]


def _images(n: int = 37, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 5, 4), dtype=torch.uint8, generator=gen)


@pytest.mark.parametrize("bounds", [(0, 37), (0, 10), (10, 20), (30, 37), (35, 99), (5, 5)])
def test_a_slice_is_bitwise_the_slice_of_the_whole_split(bounds: tuple[int, int]) -> None:
    x = _images()
    whole = to_input(x, MEAN, STD)
    lo, hi = bounds
    got = Inputs(x, MEAN, STD)[lo:hi]
    assert got.dtype == torch.float32 and torch.equal(got, whole[lo:hi])
    assert Inputs(x, MEAN, STD).shape == whole.shape and len(Inputs(x, MEAN, STD)) == 37


def test_rows_and_subsets_read_the_rows_in_their_order() -> None:
    x = _images()
    whole = to_input(x, MEAN, STD)
    rows = torch.randperm(37, generator=torch.Generator().manual_seed(1))[:20]
    inputs = Inputs(x, MEAN, STD, rows=rows)
    assert inputs.shape == (20, 3, 5, 4)
    assert torch.equal(inputs[3:11], whole[rows][3:11])
    pick = torch.tensor([4, 0, 19])
    assert torch.equal(inputs[pick], whole[rows][pick])
    sub = inputs.subset(torch.tensor([2, 7, 9, 15]))
    assert isinstance(sub, Inputs) and sub.images is inputs.images
    assert torch.equal(sub[0:4], whole[rows][[2, 7, 9, 15]])
    with pytest.raises(ValueError, match="contiguous slices"):
        inputs[0:10:2]


def test_channels_last_changes_the_layout_not_the_values() -> None:
    x = _images()
    got = Inputs(x, MEAN, STD, channels_last=True)[0:8]
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, to_input(x, MEAN, STD)[0:8])


@pytest.mark.parametrize("batch", [1, 7, 16, 50, 100])
def test_a_chain_batches_as_the_concatenation_does(batch: int) -> None:
    """Every split and OOD set of an evaluation end to end: a batch across two parts holds
    the rows it holds in ``torch.cat``, so the forward passes see the same batches."""
    a, b, c = _images(13, 1), _images(20, 2), _images(9, 3)
    plain = to_input(c, MEAN, STD)  # a part already normalised is read as it is
    parts = [Inputs(a, MEAN, STD), Inputs(b, MEAN, STD, rows=torch.arange(19, -1, -1)), plain]
    whole = torch.cat([to_input(a, MEAN, STD), to_input(b, MEAN, STD).flip(0), plain])
    chain = Chained(parts, "cpu")
    assert chain.shape == whole.shape
    for lo in range(0, len(whole), batch):
        assert torch.equal(chain[lo : lo + batch], whole[lo : lo + batch]), lo
    assert chain[42:42].shape == (0, 3, 5, 4)


def test_a_memory_mapped_split_stays_mapped_and_is_read_when_sliced(tmp_path) -> None:
    x = _images()
    np.save(tmp_path / "x.npy", x.numpy())
    mapped = read_array(tmp_path / "x.npy")
    assert is_mapped(mapped) and not is_mapped(mapped[:5]) and not is_mapped(x)
    inputs = Inputs(mapped, MEAN, STD, rows=torch.tensor([3, 1, 2]))
    assert inputs.images is mapped  # not copied, not moved: read a slice at a time
    assert torch.equal(inputs[0:3], to_input(x[[3, 1, 2]], MEAN, STD))


def test_images_must_be_uint8_nchw() -> None:
    with pytest.raises(ValueError, match="uint8"):
        Inputs(torch.zeros(2, 3, 4, 4), MEAN, STD)

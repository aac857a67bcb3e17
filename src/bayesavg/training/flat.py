"""One flat vector over a module's parameters, whatever their memory layout.

``torch.nn.utils.parameters_to_vector`` flattens with ``view(-1)``, which
fails on a channels-last 4-D weight (not contiguous), and
``vector_to_parameters`` makes every parameter a contiguous view of the
vector, silently dropping channels-last. ``params_vector`` flattens in the
same order with ``reshape`` (a copy only where the layout needs one), and
``posteriors.file.load_theta`` writes a vector back by copying, keeping the
layout. On contiguous parameters the bytes are ``parameters_to_vector``'s.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def params_vector(params: Iterable[torch.Tensor]) -> torch.Tensor:
    """The parameters in ``parameters_to_vector`` order, as one 1-D tensor."""
    return torch.cat([p.reshape(-1) for p in params])

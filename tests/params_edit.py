"""A params.yaml mapping with some keys changed, for the tests of its validation."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def with_keys(raw: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``raw`` with dotted keys set (missing sections made); ``...`` as a
    value deletes its key."""
    out = copy.deepcopy(dict(raw))
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        if value is ...:
            del node[last]
        else:
            node[last] = value
    return out

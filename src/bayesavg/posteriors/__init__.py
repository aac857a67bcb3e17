"""Weight-space posteriors over a flat parameter vector."""

from .moments import MomentCollector, as_vector
from .swag import SWAG

__all__ = ["SWAG", "MomentCollector", "as_vector"]

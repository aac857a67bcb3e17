"""Weight-space posteriors over a flat parameter vector."""

from .hwa import HWA
from .moments import MomentCollector, as_vector
from .swag import SWAG
from .vi import MeanFieldVI, gaussian_kl, svi_step

__all__ = ["HWA", "SWAG", "MeanFieldVI", "MomentCollector", "as_vector", "gaussian_kl", "svi_step"]

"""bayesavg: Bayesian deep learning by weight averaging (SWA, SWAG, HWA, DSWAG)."""

__version__ = "0.1.0"

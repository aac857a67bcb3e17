"""How a bayesavg process runs, whatever it computes: one-line user errors (``errors``,
``entry``), the pinned numerics set before torch is imported (``numerics``), the
torchrun relaunch (``launch``), atomic file writes (``io``), a stage's outputs all or
none (``outputs``) and resumable state (``checkpoint``). Every stage imports all of it,
so DVC tracks it as one folder."""

from . import outputs as outputs

"""What a run means on the hardware: the spec checked against the TPU catalogue (``checks``, whose ``resolve``
every caller uses), the slice, the Ray Train workers and the jobs' command lines (``derive``), MaxText's arguments
(``maxtext``), and the run's budget and deadline against the plan's price (``budget``). Imports ``spec`` and ``tpu``
only; the platforms build on it.
"""

from components.workload.checks import resolve

__all__ = ["resolve"]

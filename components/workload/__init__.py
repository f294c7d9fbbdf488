"""What a run means on the hardware: the spec checked against the TPU catalogue (``checks``, whose ``resolve``
every caller uses), the slice, the Ray Train workers and the jobs' command lines (``derive``), and MaxText's
arguments (``maxtext``). Imports ``spec`` and ``tpu`` only; the platforms build on it.
"""

from components.workload.checks import resolve

__all__ = ["resolve"]

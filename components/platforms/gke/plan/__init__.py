"""What a gke run creates and what it needs, derived from the run spec and the TPU catalogue with no call made.

Imports nothing else of the gke platform; ``cloud``, ``checks`` and ``run`` import it, as do the plan and dry run.
"""

"""What is checked before a gke run spends anything: preflight and its read-only calls, each finding naming a field.

Imports ``cloud`` and ``plan``; ``run`` (provision's first step) and the command line import it.
"""

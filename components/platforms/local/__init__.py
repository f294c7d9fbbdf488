"""The local platform: a real multi-node Ray cluster of processes on this machine (``cluster``: a Ray head and N
worker raylets as emulated hosts, their keeper, teardown by the ledger), and the local images — one Python
environment per image, created or reused by content hash (``envs``)."""

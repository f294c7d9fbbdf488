"""The local platform (``platform``: the Platform interface the stages run against): a real multi-node Ray cluster of
processes on this machine (``cluster``: a Ray head and N worker raylets as emulated hosts, teardown by the ledger;
``ports``: where they listen; ``processes``: the run's marked processes; ``keeper``: the host keeper that replaces a
lost host; ``auth``: the run's Ray token), and the local images — one Python environment per image, created or reused
by content hash (``envs``)."""

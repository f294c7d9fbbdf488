"""Named presets: the seed workloads, as layers over the spec's field defaults (pure data)."""

_GEMMA4_E2B_TRAIN = {
    # Seed workload B: google/gemma-4-E2B-it on databricks-dolly-15k, FSDP2, AdamW 2e-5, 3 epochs.
    "workload": "fsdp",
    "model_id": "google/gemma-4-E2B-it",
    "dataset": "databricks/databricks-dolly-15k",
    "train_split": "train[:1024]",
    "eval_split": "train[1024:1152]",
    "max_length": 512,
    "batch_size": 4,
    "epochs": 3,
    "learning_rate": 2e-5,
    "weight_decay": 0.01,
    "num_workers": 16,  # one Ray Train worker per TPU device
}

PRESETS: dict[str, dict] = {
    # The default of `make run`: the FSDP2 fine-tune on 2 emulated CPU hosts, a tiny Gemma 4 from a config
    # and the generated instruction dataset. A few minutes on 2 cores.
    "local-fsdp": {
        "cluster": {"accelerator": "cpu", "num_hosts": 2, "cpus_per_host": 1},
        "train": {
            "model_id": "scratch:gemma4-tiny",
            "dataset": "generated",
            "num_train_examples": 512,
            "num_eval_examples": 128,
            "max_length": 64,
            "batch_size": 16,
            "epochs": 3,
            "learning_rate": 3e-3,
            "weight_decay": 0.01,
        },
    },
    # Seed B on one TPU v6e 4x4 slice: 4 hosts of ct6e-standard-4t, 16 chips.
    "gemma4-e2b-v6e-16": {
        "cluster": {"accelerator": "v6e", "topology": "4x4", "num_hosts": 4, "num_slices": 1},
        "train": _GEMMA4_E2B_TRAIN,
    },
    # Seed B on one TPU7x (Ironwood) 2x2x2 slice: 2 hosts, 8 chips, 16 logical devices.
    "gemma4-e2b-tpu7x-16": {
        "cluster": {"accelerator": "tpu7x", "topology": "2x2x2", "num_hosts": 2, "num_slices": 1},
        "train": _GEMMA4_E2B_TRAIN,
    },
}

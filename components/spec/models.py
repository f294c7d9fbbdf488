"""Model configurations built from scratch (random init): no weights to download.

Pure data, importable without torch. ``scratch:<name>`` in ``train.model_id`` selects one; the trainer builds
the model with ``<family>ForCausalLM(<family>TextConfig(**config))`` and a character tokenizer.
"""

from typing import Any

SCRATCH_CONFIGS: dict[str, dict[str, Any]] = {
    # A ~0.4M-parameter member of the Gemma 4 family: sliding + full attention layers, per-layer inputs.
    "gemma4-tiny": {
        "family": "gemma4",
        "config": {
            "hidden_size": 64,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "global_head_dim": 16,
            "hidden_size_per_layer_input": 16,
            "sliding_window": 64,
            "layer_types": ["sliding_attention", "full_attention"],
            "max_position_embeddings": 512,
        },
    },
}

"""A tiny checkpoint with the layout of ``google/gemma-4-E2B-it``: ``Gemma4ForConditionalGeneration`` with a text config
(the ``scratch:gemma4-tiny`` shape: sliding and full attention, per-layer inputs) plus vision and audio configs,
written with ``save_pretrained`` and a tokenizer saved beside it. Nothing is downloaded.

``python -m tests.tiny_gemma4 DIR`` (in the torch environment) writes it to DIR.
"""

from __future__ import annotations

import sys


def build(directory: str) -> str:
    import torch
    import transformers

    from components.spec.models import SCRATCH_CONFIGS
    from trainers.model import char_tokenizer

    tokenizer = char_tokenizer()
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    text = transformers.Gemma4TextConfig(
        vocab_size=len(tokenizer),
        vocab_size_per_layer_input=len(tokenizer),
        **ids,
        **SCRATCH_CONFIGS["gemma4-tiny"]["config"],
    )
    vision = transformers.Gemma4VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
    )
    audio = transformers.Gemma4AudioConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        subsampling_conv_channels=[8, 4],
        output_proj_dims=32,
    )
    config = transformers.Gemma4Config(
        text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=audio.to_dict(), **ids
    )
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(config)
    assert model.model.vision_tower is not None and model.model.audio_tower is not None
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


if __name__ == "__main__":
    print(build(sys.argv[1]))

"""Tokenizers and causal-LM models: from the hub on real runs, from a config (random init) on local ones."""

from __future__ import annotations

import os
import string
from typing import Any

import torch

from components.spec import SCRATCH_PREFIX
from components.spec import models as model_configs
from trainers import data

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = string.printable  # letters, digits, punctuation, whitespace


def char_tokenizer() -> data.Tokenizer:
    """A character-level tokenizer that needs no downloaded files: specials then printable ASCII."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + tuple(dict.fromkeys(CHARS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", vocab["<bos>"]), ("<eos>", vocab["<eos>"])]
    )
    tok.decoder = decoders.Fuse()
    fast: data.Tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    return fast


def weights_source(model_id: str) -> str:
    """Where a hub model is read from: the run's cached copy of its revision when the train stage made one
    (``components.stages.base_weights``: the directory in ``TPUPIPE_WEIGHTS_DIR``), so no worker reaches the hub,
    read once and checked against the trusted manifest on the way (``trainers.weights_check``); else ``model_id``
    itself (a local directory, or the hub when the platform keeps no cache)."""
    if model_id.startswith(SCRATCH_PREFIX):
        return model_id
    from trainers.weights_check import checked_dir

    return checked_dir() or model_id


def load_tokenizer(model_id: str) -> data.Tokenizer:
    if model_id.startswith(SCRATCH_PREFIX):
        return char_tokenizer()
    from transformers import AutoTokenizer

    loaded: data.Tokenizer = AutoTokenizer.from_pretrained(weights_source(model_id), token=os.environ.get("HF_TOKEN"))
    return loaded


def build_model(model_id: str, tokenizer: data.Tokenizer, seed: int, dtype: torch.dtype = torch.float32) -> Any:
    """The model training starts from. Scratch configs are seeded, so the same call twice gives the same
    untrained weights (the evaluate stage's "before" model)."""
    torch.manual_seed(seed)
    if model_id.startswith(SCRATCH_PREFIX):
        entry = model_configs.SCRATCH_CONFIGS[model_id.removeprefix(SCRATCH_PREFIX)]
        import transformers

        family = {"gemma4": "Gemma4"}[entry["family"]]
        config_cls = getattr(transformers, f"{family}TextConfig")
        model_cls = getattr(transformers, f"{family}ForCausalLM")
        config = config_cls(
            vocab_size=len(tokenizer),
            vocab_size_per_layer_input=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            use_cache=False,
            **entry["config"],
        )
        return model_cls(config).to(dtype)
    return load_pretrained(weights_source(model_id), dtype)


def load_pretrained(path_or_id: str, dtype: torch.dtype = torch.float32) -> Any:
    """A hub name or local directory, loaded for text training. A composite checkpoint (``google/gemma-4-E2B-it`` is
    ``Gemma4ForConditionalGeneration``: text, vision and audio configs) loads without its vision and audio towers;
    its ``__init__`` takes no ``use_cache``, so the cache is turned off on the text config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    token = os.environ.get("HF_TOKEN")
    config = AutoConfig.from_pretrained(path_or_id, token=token)
    for tower in ("vision_config", "audio_config"):
        if hasattr(config, tower):
            setattr(config, tower, None)
    config.get_text_config().use_cache = False
    return AutoModelForCausalLM.from_pretrained(
        path_or_id, config=config, dtype=dtype, attn_implementation="eager", token=token
    )


def load_trained(
    model_id: str, checkpoint: str, tokenizer: data.Tokenizer, seed: int, dtype: torch.dtype = torch.float32
) -> Any:
    """A fine-tuned model: the base model (``model_id``, which holds the frozen per-layer table the checkpoint
    leaves out) with the checkpoint's trained weights loaded over it."""
    from pathlib import Path

    from safetensors.torch import load_file

    from trainers.checkpoints import final_committed

    final_committed(Path(checkpoint))  # refused before the base model is built: a save cut short is never loaded
    model = build_model(model_id, tokenizer, seed, dtype)
    state = load_file(os.path.join(checkpoint, "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = set(missing) - frozen_names(model) - {"lm_head.weight"}
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {checkpoint} does not fit {model_id}: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    return model


def language_model(model: Any) -> torch.nn.Module:
    """The decoder stack: ``model.model.language_model`` in a composite (text + towers) model, else ``model.model``."""
    inner = model.model
    return getattr(inner, "language_model", inner)


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    return list(language_model(model).layers)


def frozen_params(model: Any) -> set[torch.nn.Parameter]:
    """Parameters kept out of training and of sharding: Gemma's per-layer embedding table."""
    table = getattr(language_model(model), "embed_tokens_per_layer", None)
    return set(table.parameters()) if table is not None else set()


def frozen_names(model: Any) -> set[str]:
    """The state-dict names of :func:`frozen_params` (what checkpoints leave out)."""
    frozen = {id(p) for p in frozen_params(model)}
    return {name for name, p in model.named_parameters(remove_duplicate=False) if id(p) in frozen}

"""Training code that runs inside the trainer images (on Ray workers).

Typed throughout (mypy, strict: pyproject.toml). torch, transformers, jax and MaxText are the trainer images'
packages, not the environment mypy runs in, so their objects (models, optimizers, tensors, devices, meshes, process
groups) are typed ``Any``; a value of ours that holds one is typed by what it is of ours (``trainers.data.Tokenizer``:
the part of a Hugging Face tokenizer the trainers use).
"""

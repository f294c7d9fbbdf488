"""Instruction data: the generated task, the prompt format, loading and tokenising.

The generated task (``train.dataset=generated``, the local presets' data) is a small closed set of facts: eight
countries' capitals, each asked in four phrasings ("Capital of Peru?", "What is Peru's capital?", ...), the answer the
capital alone. The held-out split asks questions no training example asks: each country is held out in one phrasing
it is never trained in (``HELDOUT_PAIRS``), trained in the other three, and every phrasing is trained with the other
countries. A held-out prompt is thus a taught fact asked in a way the model never saw for that country: its loss is
not a training loss, and its exact match is above the majority answer's share only if what the model learnt of a
country carries to a phrasing: the local preset's 128 steps in batches of 8 get there, 48 in batches of 16 do not
(docs/local.md, "The generated data", has measured examples). Instructions repeat within a split (24 trained
questions, 8 held-out ones).

Generation and formatting are pure Python; a hub dataset's loading imports ``datasets`` and tokenising the tokenizer's
libraries and torch, lazily, so the pipeline image can generate data without them.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from components.spec import RunSpec, datasets

PROMPT = "Instruction: {instruction}\nResponse: {response}"


class Examples(Protocol):
    """A split's examples as the trainers read them (:func:`load_split`): a list of dicts (a job's own files) or a
    ``datasets.Dataset`` (a hub dataset, which has no type information here), either one sized and read in order."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[dict[str, Any]]: ...


class Tokenizer(Protocol):
    """What the trainers use of a Hugging Face tokenizer (transformers' ``PreTrainedTokenizerBase``: transformers has
    no type information here, so a tokenizer is Any until it is passed as one of these)."""

    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    name_or_path: str
    padding_side: str

    def __len__(self) -> int: ...

    def __call__(self, text: list[str], *, add_special_tokens: bool) -> Any: ...  # a BatchEncoding: dict-like

    def get_vocab(self) -> dict[str, int]: ...

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool) -> str: ...

    def save_pretrained(self, save_directory: str | Path) -> Any: ...


# The generated task's facts and phrasings (the module's docstring). Short names: the longest example with the
# beginning and end tokens is 58 tokens with a scratch model's character tokenizer (one token a character), within
# the local presets' train.max_length, 64 (components/spec/presets.py; tests/unit/test_data.py checks every preset
# that generates data, with a margin).
CAPITALS = (
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Peru", "Lima"),
    ("Italy", "Rome"),
    ("Egypt", "Cairo"),
    ("Spain", "Madrid"),
    ("Cuba", "Havana"),
    ("Norway", "Oslo"),
)
PHRASINGS = (
    "Capital of {country}?",
    "What is {country}'s capital?",
    "Name the capital of {country}.",
    "The capital of {country} is?",
)
# Held out: each country in one phrasing it is never trained in, the phrasing rotating over the countries (a Latin
# square), so every phrasing is trained with the other countries and every country in the other phrasings.
HELDOUT_PAIRS = tuple((country, PHRASINGS[i % len(PHRASINGS)]) for i, (country, _) in enumerate(CAPITALS))
TRAINED_PAIRS = tuple((c, p) for p in PHRASINGS for c, _ in CAPITALS if (c, p) not in HELDOUT_PAIRS)


def _example(pair: tuple[str, str]) -> dict[str, str]:
    country, phrasing = pair
    return {"instruction": phrasing.format(country=country), "response": dict(CAPITALS)[country]}


def generate(num_train: int, num_eval: int, seed: int = 0) -> dict[str, list[dict[str, str]]]:
    """The deterministic generated dataset: same arguments, same examples. The train split asks the trained (country,
    phrasing) pairs, the held-out split the held-out ones (``HELDOUT_PAIRS``), each example's pair drawn with
    ``seed``: an instruction repeats within a split, never across them."""
    rng = random.Random(seed)
    return {
        "train": [_example(rng.choice(TRAINED_PAIRS)) for _ in range(num_train)],
        "heldout": [_example(rng.choice(HELDOUT_PAIRS)) for _ in range(num_eval)],
    }


def write_generated(directory: Path, num_train: int, num_eval: int, seed: int = 0) -> dict[str, str]:
    """Write the generated splits as JSONL files; returns {split: path}."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, rows in generate(num_train, num_eval, seed).items():
        path = directory / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files[split] = str(path)
    return files


def job_files(spec: RunSpec, output_dir: Path) -> dict[str, str] | None:
    """The files a job reads, by split: the generated dataset (written now, the same in every job), the two files of
    the run's data snapshot (the first stage's, copied under the jobs' directory by the train stage:
    components/stages/dataset.py), or None for a hub dataset, loaded by name."""
    t = spec.train
    if t.dataset == datasets.GENERATED:
        return write_generated(output_dir / "data", t.num_train_examples, t.num_eval_examples, t.seed)
    if datasets.snapshotted(t.dataset):
        return {split: str(output_dir / "data" / f"{split}.jsonl") for split in datasets.SNAPSHOT_SPLITS}
    return None


def splits(spec: RunSpec) -> tuple[str, str]:
    """(train split, evaluation split) the jobs read: a snapshot's files, else the spec's splits."""
    return datasets.splits(spec.train.dataset, spec.train.train_split, spec.train.eval_split)


def snapshot(examples: Iterable[dict[str, Any]]) -> str:
    """``sha256:<hex>`` of the examples in order, each as JSON with sorted keys on a line of its own: a model's data
    snapshot. The same examples give the same digest wherever they came from (generated, a file, the hub); any
    change to one of them, or to their order or number, gives another."""
    h = hashlib.sha256()
    for example in examples:
        h.update(json.dumps(example, sort_keys=True, separators=(",", ":"), default=str).encode() + b"\n")
    return "sha256:" + h.hexdigest()


def format_example(example: dict[str, Any]) -> str:
    return PROMPT.format(instruction=example["instruction"], response=example["response"])


def prompt_of(example: dict[str, Any]) -> str:
    """The training prompt's format up to where the response starts: what a model is asked (:func:`prompt_ids`), and
    what its loss leaves out (:data:`LABELS`)."""
    return PROMPT.split("{response}")[0].format(instruction=example["instruction"])


def local_cache_dir(run_name: str) -> str:
    """Where a host's workers keep the datasets cache: its own temporary directory (a pod's /tmp on GKE, an emptyDir;
    the run's private temp directory on the local platform), never the bucket's shared mount. The datasets library
    locks its cache with files on the local filesystem, which a GCS FUSE directory written by every host at once does
    not make safe (Cloud Storage FUSE's semantics: https://cloud.google.com/storage/docs/cloud-storage-fuse/overview,
    "Differences from POSIX file systems")."""
    import tempfile

    return str(Path(tempfile.gettempdir()) / "tpupipe-datasets" / run_name)


def load_split(dataset: str, split: str, data_files: dict[str, str] | None, cache_dir: str | None = None) -> Examples:
    """One split: the job's own JSON-lines files (the generated dataset, a run's snapshot: ``job_files``) read as they
    are, one example a line, without the ``datasets`` library (its import and its Arrow conversion are most of a
    small split's load); else a local JSON file or a hub name through ``datasets.load_dataset``. Either way the
    examples are dicts, in the file's order."""
    if data_files is not None:
        with open(data_files[split], encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    import datasets

    loaded: Examples  # a datasets.Dataset
    if dataset.endswith((".json", ".jsonl")):
        loaded = datasets.load_dataset("json", data_files=dataset, split=split, cache_dir=cache_dir)
    else:
        loaded = datasets.load_dataset(dataset, split=split, cache_dir=cache_dir)
    return loaded


# ---------------------------------------------------------------- tokenised, in memory, kept for the run

# What a model is trained on and measured by: the next-token loss over the response's tokens and the end token, none
# over the prompt or the padding, as supervised fine-tuning computes it (TRL's SFTTrainer, "Train on completion
# only": completion_only_loss, https://huggingface.co/docs/trl/sft_trainer#train-on-completion-only; labels of -100
# are ignored by the loss, https://huggingface.co/docs/transformers/tasks/language_modeling#preprocess). Each
# example's ids are the prompt's ids exactly as decoding feeds them (:func:`prompt_ids`), the response's, then the
# tokenizer's end token, always (TRL appends it, ``add_eos``: hub tokenizers such as Gemma's and Llama's add none of
# their own), so the model learns to continue the very prefix it is asked with and to stop. Part of the tokenised
# split's key, of every held-out figure's key (trainers.heldout.eval_key) and of the resume digest
# (trainers.checkpoints.training_digest): a figure or a checkpoint made under another rule is never taken for one
# made under this. Change the text whenever the rule changes.
LABELS = "prompt ids as generation encodes them, response ids, end token; -100 over the prompt and the padding"

TOKENIZED_DIR = "tokenized"  # under the run's own cache directory (components.workload.cache_trust.RUN_CACHE_DIR)
_COLUMNS = ("input_ids", "attention_mask", "labels")


def tokenizer_identity(tokenizer: Tokenizer) -> dict[str, Any]:
    """What tokenising depends on in ``tokenizer``: its class, name, padding side, pad token and vocabulary (as a
    digest)."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items())).encode()
    return {
        "class": type(tokenizer).__name__,
        "name": tokenizer.name_or_path,
        "padding_side": tokenizer.padding_side,
        "pad_token_id": tokenizer.pad_token_id,
        "vocab": hashlib.sha256(vocab).hexdigest(),
    }


def tokenized_key(examples: str, tokenizer: dict[str, Any], max_length: int) -> str:
    """The name of a tokenised split in the cache: a digest of the examples (``snapshot``), the tokenizer
    (``tokenizer_identity``), the prompt, the length and the labels' rule. The directory it lives in is keyed by the
    trainer image and the model (``components.workload.cache.key``), so another tokenizers library misses too."""
    what = {
        "examples": examples,
        "tokenizer": tokenizer,
        "prompt": PROMPT,
        "max_length": max_length,
        "labels": LABELS,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


class Tokenized:
    """A tokenised split as three int64 tensors of [examples, max_length]: ``input_ids``, ``attention_mask`` and
    ``labels``. An index (an int, a slice, a list of ints) gives a dict of those rows, so a batch is one gather per
    column (the DataLoader's ``__getitems__``), with no per-example collation. ``cached``: read from the run's cache
    (left by an earlier worker group of the same run) rather than tokenised."""

    def __init__(self, columns: dict[str, Any], cached: bool = False) -> None:
        self.columns = {name: columns[name] for name in _COLUMNS}
        self.cached = cached

    def __len__(self) -> int:
        return int(self.columns["input_ids"].shape[0])

    def __getitem__(self, index: int | slice | list[int]) -> dict[str, Any]:
        return {name: column[index] for name, column in self.columns.items()}

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        return self[indices]


def prompt_ids(tokenizer: Tokenizer, prompts: list[str]) -> list[list[int]]:
    """Each prompt's ids as a model is asked with it: the tokenizer's beginning token, if it has one, then the text's
    own tokens, no end token. One function for training and decoding (``trainers.generation.encode``), so the prefix
    the loss trains a continuation of is the one decoding feeds (TRL's SFTTrainer warns when its prompt's ids are
    not the start of its prompt-and-completion's: trl/trainer/sft_trainer.py)."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return [bos + ids for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]


def _encode(examples: Examples, tokenizer: Tokenizer, max_length: int) -> dict[str, Any]:
    """Each example as :data:`LABELS` says: :func:`prompt_ids`, the response's ids, the end token, cut to
    ``max_length`` (the end token goes with the response when they do not fit, so the model never learns to stop
    mid-answer) and right-padded to it; labels are the input ids past the prompt, -100 over the prompt and the
    padding."""
    import torch

    prompts = prompt_ids(tokenizer, [prompt_of(e) for e in examples])
    responses = tokenizer([str(e["response"]) for e in examples], add_special_tokens=False)["input_ids"]
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids = torch.full((len(examples), max_length), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(examples), max_length), dtype=torch.long)
    labels = torch.full((len(examples), max_length), -100, dtype=torch.long)
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        row = (prompt + response + eos)[:max_length]
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
        labels[i, len(prompt) : len(row)] = ids[i, len(prompt) : len(row)]
    _check_labelled(labels, max(map(len, prompts), default=0), max_length)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _check_labelled(labels: Any, longest_prompt: int, max_length: int) -> None:
    """An example whose prompt fills ``max_length`` has no token the loss is over: it teaches and measures nothing.
    Some of them: a warning with their count; all of them: an error naming ``train.max_length``, since training would
    run on a loss of 0 and every held-out figure would be 0, which no gate can compare."""
    empty = int((labels != -100).sum(dim=1).eq(0).sum())
    if empty == 0:
        return
    said = (
        f"{empty} of {labels.shape[0]} example(s) have no response token within train.max_length={max_length} "
        f"(the longest prompt is {longest_prompt} tokens)"
    )
    if empty == labels.shape[0]:
        raise ValueError(f"train.max_length: {said}: nothing to train or measure on; raise train.max_length")
    warnings.warn(f"{said}: they are left out of the loss", stacklevel=3)


def _read_cached(path: Path, key: str, rows: int, max_length: int) -> dict[str, Any] | None:
    """The cached split at ``path``, or None when there is none; a damaged or foreign entry is a miss with a warning,
    never a failed run."""
    from safetensors import safe_open

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            if (f.metadata() or {}).get("key") != key:
                raise ValueError("it was written for another key")
            columns = {name: f.get_tensor(name) for name in _COLUMNS}
        for name, column in columns.items():
            if tuple(column.shape) != (rows, max_length):
                raise ValueError(f"{name} is {tuple(column.shape)}, not ({rows}, {max_length})")
        return columns
    except Exception as e:  # noqa: BLE001 - whatever is wrong with an entry, tokenising again is the remedy
        warnings.warn(f"ignoring the cached tokenised split {path} ({e}): tokenising again", stacklevel=3)
        return None


def _write_cached(path: Path, key: str, columns: dict[str, Any]) -> None:
    """Write the entry whole under a name of its own, then rename it into place: a reader sees all of it or none."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    save_file({k: v.contiguous() for k, v in columns.items()}, str(partial), metadata={"key": key})
    os.replace(partial, path)


def tokenize(
    examples: Examples, tokenizer: Tokenizer, max_length: int, cache: str = "", write: bool = True
) -> Tokenized:
    """The examples tokenised (:class:`Tokenized`). ``cache``: the run's own cache directory, which no other run
    reads (empty: none), where the split is looked up by :func:`tokenized_key` and, on a miss, written when
    ``write`` (one rank writes)."""
    if not cache:
        return Tokenized(_encode(examples, tokenizer, max_length))
    key = tokenized_key(snapshot(examples), tokenizer_identity(tokenizer), max_length)
    path = Path(cache) / TOKENIZED_DIR / f"{key}.safetensors"
    columns = _read_cached(path, key, len(examples), max_length)
    if columns is not None:
        return Tokenized(columns, cached=True)
    columns = _encode(examples, tokenizer, max_length)
    if write:
        try:
            _write_cached(path, key, columns)
        except OSError as e:  # a cache that cannot be written costs the next run the tokenising, nothing more
            warnings.warn(f"could not keep the tokenised split in {path} ({e})", stacklevel=2)
    return Tokenized(columns)

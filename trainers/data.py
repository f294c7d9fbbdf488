"""Instruction data: the generated task, the prompt format, loading and tokenising.

Generation and formatting are pure Python; loading and tokenising import ``datasets``/``transformers``
lazily, so the pipeline image can generate data without them.
"""

from __future__ import annotations

import hashlib
import json
import random
import string
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from components.spec import RunSpec, datasets

PROMPT = "Instruction: {instruction}\nResponse: {response}"

# Generated task: short string and arithmetic instructions a tiny model measurably learns in minutes.
_TASKS = ("reverse", "upper", "add", "repeat", "sort")


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 6)))


def _example(rng: random.Random) -> dict[str, str]:
    task = rng.choice(_TASKS)
    if task == "add":
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        return {"instruction": f"Add {a} and {b}.", "response": str(a + b)}
    word = _word(rng)
    if task == "reverse":
        return {"instruction": f"Reverse the word {word}.", "response": word[::-1]}
    if task == "upper":
        return {"instruction": f"Write {word} in capitals.", "response": word.upper()}
    if task == "repeat":
        return {"instruction": f"Repeat {word} twice.", "response": f"{word} {word}"}
    return {"instruction": f"Sort the letters of {word}.", "response": "".join(sorted(word))}


def generate(num_train: int, num_eval: int, seed: int = 0) -> dict[str, list[dict[str, str]]]:
    """The deterministic generated dataset: same arguments, same examples. Held-out prompts never repeat
    a training prompt."""
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[dict[str, str]]] = {"train": [], "heldout": []}
    for split, count in (("train", num_train), ("heldout", num_eval)):
        while len(splits[split]) < count:
            ex = _example(rng)
            if ex["instruction"] in seen:
                continue
            seen.add(ex["instruction"])
            splits[split].append(ex)
    return splits


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


def local_cache_dir(run_name: str) -> str:
    """Where a host's workers keep the datasets cache: its own temporary directory (a pod's /tmp on GKE, an emptyDir;
    the run's private temp directory on the local platform), never the bucket's shared mount. The datasets library
    locks its cache with files on the local filesystem, which a GCS FUSE directory written by every host at once does
    not make safe (Cloud Storage FUSE's semantics: https://cloud.google.com/storage/docs/cloud-storage-fuse/overview,
    "Differences from POSIX file systems")."""
    import tempfile

    return str(Path(tempfile.gettempdir()) / "tpupipe-datasets" / run_name)


def load_split(dataset: str, split: str, data_files: dict[str, str] | None, cache_dir: str | None = None):
    """One split through ``datasets.load_dataset``: generated/local JSON files or a hub name."""
    import datasets

    if data_files is not None:
        return datasets.load_dataset("json", data_files=data_files, split=split, cache_dir=cache_dir)
    if dataset.endswith((".json", ".jsonl")):
        return datasets.load_dataset("json", data_files=dataset, split=split, cache_dir=cache_dir)
    return datasets.load_dataset(dataset, split=split, cache_dir=cache_dir)


def _fingerprint(ds, tokenizer, max_length: int) -> str:
    """What the tokenised split depends on, hashed: the split's own fingerprint, the tokenizer (its class, name and
    vocabulary, padding side and pad token), the prompt, the length and the labels' masking (``tokenize``)."""
    h = hashlib.sha256()
    for part in (
        ds._fingerprint,
        type(tokenizer).__name__,
        tokenizer.name_or_path,
        tokenizer.padding_side,
        tokenizer.pad_token_id,
        PROMPT,
        max_length,
        "labels: input ids, -100 where padded",
    ):
        h.update(repr(part).encode() + b"\0")
    h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    return h.hexdigest()[:32]


def tokenize(ds, tokenizer, max_length: int):
    """Prompt-format, tokenise, pad to max_length; labels mask the padding (causal-LM collation)."""

    def encode(example):
        enc = tokenizer(format_example(example), max_length=max_length, padding="max_length", truncation=True)
        enc["labels"] = [
            tok if mask else -100 for tok, mask in zip(enc["input_ids"], enc["attention_mask"], strict=True)
        ]
        return enc

    # The fingerprint (the name of the map's cache) given, not derived by hashing ``encode``: that hash disassembles the
    # closure (dill.detect.nestedglobals), which in a Ray Train worker prints its bytecode into the job's log.
    ds = ds.map(encode, remove_columns=ds.column_names, new_fingerprint=_fingerprint(ds, tokenizer, max_length))
    ds.set_format("torch", columns=["input_ids", "attention_mask", "labels"])
    return ds

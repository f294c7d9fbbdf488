"""The generated dataset as MaxText's Hugging Face input pipeline reads it, and a tokenizer that needs no download.

``maxtext.dataset_type=hf`` points MaxText at two JSON Lines files and a tokenizer directory
(``components.workload.maxtext.data_paths``): ``hf_path=json`` with ``hf_train_files`` and ``hf_eval_files``,
``tokenizer_path``. MaxText 0.2.5 reads them with ``datasets.load_dataset("json", data_files=..., streaming=True)``
and ``transformers.AutoTokenizer.from_pretrained(tokenizer_path, add_bos_token=..., add_eos_token=...)``
(``maxtext/input_pipeline/hf_data_processing.py``, ``make_hf_train_iterator``/``make_hf_eval_iterator`` and
``preprocessing_pipeline``), its ``text`` column (``train_data_columns``/``eval_data_columns`` of ``base.yml``);
with ``hf_eval_files`` set it reads the eval file's only split, "train" (``maxtext/configs/types.py``). The
driver writes all three before Ray Train starts, the same bytes each time (a train job and an eval job of one run
both write them).

The examples are ``trainers.data.generate``'s: the train split for training, the held-out split for MaxText's eval
loop. Each row carries an ``id``, a digest of its place in its split and its instruction: unique within a split,
where an instruction repeats, and across them, where none does (``generate`` holds out whole questions), so no eval
id is a training id (the tests check it on the files MaxText was given).

The tokenizer is character level: the ASCII printable characters and four special tokens, 101 ids, which fits the
tiny Llama's ``vocab_size`` 256; built with the ``tokenizers`` library and saved with ``transformers``'
``save_pretrained``, it loads offline through ``AutoTokenizer`` as MaxText calls it (transformers 5 adds the BOS and
EOS tokens itself when asked to: ``add_bos_token``/``add_eos_token``).
"""

from __future__ import annotations

import hashlib
import json
import os
import string
from pathlib import Path

from trainers import data

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
CHARACTERS = tuple(c for c in string.printable if c not in "\x0b\x0c\r")


def example_id(example: dict[str, str], index: int) -> str:
    """The id of the row at ``index`` of its split: a digest of the index and the instruction."""
    return hashlib.sha256(f"{index}\n{example['instruction']}".encode()).hexdigest()[:16]


def rows(examples: list[dict[str, str]]) -> list[dict[str, str]]:
    """MaxText's rows: ``text`` (the prompt format FSDP trains on, ``trainers.data.PROMPT``) and the ``id``."""
    return [{"id": example_id(ex, i), "text": data.format_example(ex)} for i, ex in enumerate(examples)]


def _write(path: Path, text: str) -> None:
    """Write whole or not at all: a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_dataset(train_file: str, eval_file: str, num_train: int, num_eval: int, seed: int) -> dict[str, int]:
    """The generated train and held-out splits as JSON Lines at the two paths; returns the row counts."""
    return write_splits(train_file, eval_file, data.generate(num_train, num_eval, seed))


def read_snapshot(directory: Path) -> dict[str, list[dict[str, str]]]:
    """The run's data snapshot's two splits, as the train stage put them under the jobs' directory (``data/``)."""
    return {
        split: [json.loads(line) for line in (directory / f"{split}.jsonl").read_text().splitlines() if line]
        for split in ("train", "heldout")
    }


def write_splits(train_file: str, eval_file: str, splits: dict[str, list[dict[str, str]]]) -> dict[str, int]:
    """The ``train`` and ``heldout`` examples as MaxText's rows at the two paths; returns the row counts."""
    counts = {}
    for split, path in (("train", train_file), ("heldout", eval_file)):
        lines = rows(splits[split])
        _write(Path(path), "".join(json.dumps(r, sort_keys=True) + "\n" for r in lines))
        counts[split] = len(lines)
    return counts


def read_ids(path: str) -> list[str]:
    return [json.loads(line)["id"] for line in Path(path).read_text().splitlines() if line]


def write_tokenizer(directory: str) -> int:
    """The character-level tokenizer, saved where ``AutoTokenizer.from_pretrained`` finds it; returns its size."""
    import tempfile

    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        fast.save_pretrained(tmp)
        for f in Path(tmp).iterdir():
            _write(target / f.name, f.read_text())
    return len(vocab)

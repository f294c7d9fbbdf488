"""Answers to the evaluation prompts from a model sharded with FSDP2 over two ranks (``trainers.generation``), as the
train and evaluation jobs give them: in one padded shape, each rank decoding its share in step with the other
(``synced_gpus``), gathered in the prompts' order. Each answer is the one the same weights give unsharded to the prompt
alone (no padding, no batch); the file holds every prompt, its reference and each metric's score (ROUGE-L by
rouge-score, in the trainer environment); answers kept to be scored later are scored alike by rank 0 alone; a team's
scorer that raises is named with the example's index. Run in the torch trainer environment (two processes, a gloo
group, no Ray)."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from components.spec import protocol

pytestmark = pytest.mark.trainer_env  # the torch trainer environment, which `make test` builds beside the fast tiers

SCRIPT = r"""
import json, os, sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh

SETS = "num_train_examples=32 num_eval_examples=40 eval.generate_examples=17 eval.max_new_tokens=6 batch_size=4"


def work(rank, root, port, scorer, early):
    from components.workload import resolve
    from trainers import data, generation, mesh
    from trainers.devices import Worker
    from trainers.model import build_model, load_tokenizer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    spec = resolve("local-fsdp", SETS + (f" eval.scorer={scorer}" if scorer else ""))
    t = spec.train
    tokenizer = load_tokenizer(t.model_id)
    config = {"data_files": data.job_files(spec, root), "cache_dir": str(root / "cache"), "output_dir": str(root)}
    model = mesh.parallelize(build_model(t.model_id, tokenizer, t.seed), init_device_mesh("cpu", (2,)))
    if early and rank == 0:  # rank 0 asks the first prompt 17 times, and the token its answer begins with ends it
        first = json.loads(Path(config["data_files"]["heldout"]).read_text().splitlines()[0])
        config["data_files"] = {**config["data_files"], "heldout": str(root / "first-only.jsonl")}
        Path(config["data_files"]["heldout"]).write_text((json.dumps(first) + "\n") * 17)
        ids, mask = generation.encode(tokenizer, [data.prompt_of(first)], t.max_length)
        whole = build_model(t.model_id, tokenizer, t.seed).eval()
        tokenizer.eos_token_id = whole(input_ids=ids, attention_mask=mask).logits[0, -1].argmax().item()
    try:
        answering = generation.Answering(spec, config, tokenizer, Worker(rank, 2, "cpu", torch.device("cpu")))
        if not early and not scorer:  # answers kept, a collective like any answering, then scored by rank 0 alone
            answering.kept(model, "before")
            kept = (Path(config["output_dir"]) / "eval" / "answered-before.json").is_file()
        found = answering(model, "after")
        if not early and not scorer and rank == 0:
            print("KEPT " + json.dumps({"kept": kept, "scored": answering.score_kept("before")}), flush=True)
    except Exception as exc:
        print(f"RANK{rank} {type(exc).__name__}: {exc}", flush=True)
        raise
    if rank == 0 and early:
        print("FACTS " + json.dumps({"found": found}), flush=True)
    elif rank == 0:
        alone = []  # the same weights, unsharded, one prompt at a time
        whole = build_model(t.model_id, tokenizer, t.seed).eval()
        for row in generation.Answering(spec, config, tokenizer, Worker(0, 1, "cpu", None)).examples:
            prompt = tokenizer(data.prompt_of(row), add_special_tokens=False)["input_ids"]
            ids = torch.tensor([[tokenizer.bos_token_id] + prompt])
            out = whole.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                                 do_sample=False, use_cache=True, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
            alone.append(generation.decode(tokenizer, out[0, ids.shape[1]:].tolist()))
        print("FACTS " + json.dumps({"found": found, "alone": alone}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(work, args=(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "early"), nprocs=2)
"""

SCORER = """
def picky(prompt, reference, answer):
    if {instruction!r} in prompt:
        raise ZeroDivisionError("the team's bug")
    return 0.5
"""


def _run(
    tmp_path, scorer: str = "", early: bool = False, timeout: float = 600, modules: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The script's two ranks; ``modules``: a team's scorer modules, added to trainers/scorers/ of a tree of this
    checkout's trainers first on their import path (tests.helpers.scorers_tree)."""
    from components.platforms.local import envs
    from tests.helpers import REPO, scorers_tree

    python = envs.ensure_env("torch").python
    env = {
        "PATH": "/usr/bin:/bin",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "HOME": str(tmp_path),
        "PYTHONPATH": f"{scorers_tree(tmp_path, modules)}:{REPO}" if modules else str(REPO),
    }
    with socket.socket() as s:  # the gloo group's rendezvous port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "answering.py"  # a file: the spawned ranks import their function from it
    script.write_text(SCRIPT)
    return subprocess.run(
        [python, str(script), str(tmp_path), str(port), scorer, "early" if early else ""],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_sharded_answers_are_the_unsharded_models_each_prompt_alone_in_order(tmp_path):
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))[6:])
    rows = [json.loads(line) for line in (tmp_path / "eval" / "answers-after.jsonl").read_text().splitlines()]
    heldout = [json.loads(line) for line in (tmp_path / "data" / "heldout.jsonl").read_text().splitlines()][:17]
    assert [r["reference"] for r in rows] == [e["response"] for e in heldout]  # 17: the last batch padded, dropped
    assert [r["answer"] for r in rows] == facts["alone"]
    assert all(r["prompt"].startswith("Instruction: ") and r["prompt"].endswith("Response: ") for r in rows)
    assert set(rows[0]["scores"]) == {"exact_match", "normalized_exact_match", "rouge_l", "answer_length"}
    assert all(0 <= r["scores"]["rouge_l"] <= 1 for r in rows)
    found = facts["found"]
    assert found["num_examples"] == 17 and found["generation_key"].startswith("sha256:")
    assert found["means"]["answer_length"] == pytest.approx(sum(r["scores"]["answer_length"] for r in rows) / 17)
    # The model's answers kept (written by rank 0 after the collective) and scored later, by rank 0 alone: the same
    # model's answers, the same file format, the waiting file gone, an ``answered`` event for the answering's seconds.
    kept = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("KEPT "))[5:])
    assert kept["kept"] is True and kept["scored"]["which"] == "before" and kept["scored"]["num_examples"] == 17
    before = [json.loads(line) for line in (tmp_path / "eval" / "answers-before.jsonl").read_text().splitlines()]
    assert before == rows and not (tmp_path / "eval" / "answered-before.json").exists()
    events = [p for kind, p in protocol.parse(proc.stdout.splitlines()) if kind == "event"]
    assert [(p["event"], p["which"]) for p in events] == [
        ("answered", "before"),
        ("answers", "after"),
        ("answers", "before"),
    ]
    assert events[0]["seconds"] > 0


def test_a_rank_whose_answers_end_first_keeps_stepping_with_the_others(tmp_path):
    """Rank 0's answers all end at their first token, rank 1's run their 6: under FSDP every forward is a collective,
    so without ``synced_gpus=True`` rank 0 would leave ``generate`` for the answers' all_gather while rank 1 waits in
    its next forward's all-gather of the weights: the collectives no longer match (seen with the flag off: gloo aborts
    the job, ``gloo::EnforceNotMet``; on other backends such a mismatch can hang, hence the timeout)."""
    proc = _run(tmp_path, early=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "eval" / "answers-after.jsonl").read_text().splitlines()]
    assert all(r["answer"] == "" for r in rows[0::2])  # rank 0's, each ended at once
    assert any(r["answer"] for r in rows[1::2])  # rank 1's went on (rank 0 decodes them: cut at its end token)


def test_a_scorer_that_raises_names_itself_and_the_example(tmp_path):
    """The scorer raises on the first evaluation example that asks the fifth example's question (held-out questions
    repeat: the fifth's is first asked there, index 4): the job fails naming eval.scorer and that index."""
    from components.workload import resolve
    from trainers import data

    spec = resolve("local-fsdp", "num_train_examples=32 num_eval_examples=40")
    asked = [ex["instruction"] for ex in data.generate(32, 40, spec.train.seed)["heldout"]]
    first = asked.index(asked[4])
    assert first > 0  # not the first example: the error's index is the example's own
    ref = "trainers.scorers.team_scorer:picky"  # a team's module added to the trainer's scorers package
    proc = _run(tmp_path, ref, modules={"team_scorer": SCORER.format(instruction=asked[4])})
    assert proc.returncode != 0
    said = f"RANK0 ScorerError: eval.scorer {ref}: raised on example {first}: ZeroDivisionError"
    assert said in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]

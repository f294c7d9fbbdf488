"""A job's log as the stage saves it on this machine (``components.stages.jobs``): each chunk's complete lines
redacted once and appended to ``logs/<kind>.log``, not the whole log redacted and rewritten per chunk (a cost that grew
with the job: a long FSDP run's stage took a third of a core for it); a line cut between two chunks waits for its end,
and the last one is kept at the job's end."""

from components.platforms import RunContext
from components.platforms.store import LocalStore
from components.stages import jobs
from components.workload import resolve

TOKEN = "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2"  # shaped like a Hugging Face token: redacted by its shape


def test_a_jobs_log_is_appended_line_by_line_redacted_once_and_its_last_cut_line_kept_at_the_end(tmp_path, capsys):
    ctx = RunContext(spec=resolve("local-fsdp", ""), run_id="r", store=LocalStore(tmp_path / "r"), platform="local")
    state = jobs._Follow(before="the attempt before\n")
    log = tmp_path / "r" / "logs" / "train.log"

    jobs._take("step 1\nstep 2\nste", "train", state, ctx, None)
    assert log.read_text() == "the attempt before\nstep 1\nstep 2\n"  # the cut line waits for its end
    inode = log.stat().st_ino
    jobs._take(f"p 3\ntoken {TOKEN}\n", "train", state, ctx, None)
    jobs._take("the end, unfinished", "train", state, ctx, None)
    assert log.stat().st_ino == inode  # appended to, not replaced by a rewrite of the whole
    assert log.read_text() == "the attempt before\nstep 1\nstep 2\nstep 3\ntoken [redacted]\n"
    jobs._take("", "train", state, ctx, None, final=True)
    assert log.read_text().endswith("token [redacted]\nthe end, unfinished\n")
    printed = capsys.readouterr().out
    assert "  [train] step 3\n" in printed and "  [train] token [redacted]\n" in printed and TOKEN not in printed
    assert TOKEN not in log.read_text()


def test_a_record_split_between_two_chunks_is_parsed_once_whole(tmp_path):
    ctx = RunContext(spec=resolve("local-fsdp", ""), run_id="r", store=LocalStore(tmp_path / "r"), platform="local")
    state = jobs._Follow(nonce="0a1b")
    seen: list[tuple[str, dict]] = []
    jobs._take('TPUPIPE[0a1b] event {"event": "st', "train", state, ctx, lambda k, p: seen.append((k, p)))
    assert seen == []
    jobs._take('ep", "step": 7}\n', "train", state, ctx, lambda k, p: seen.append((k, p)))
    assert seen == [("event", {"event": "step", "step": 7})]


def test_a_credential_whose_value_comes_on_the_line_after_its_name_in_the_next_chunk_is_redacted(tmp_path):
    ctx = RunContext(spec=resolve("local-fsdp", ""), run_id="r", store=LocalStore(tmp_path / "r"), platform="local")
    state = jobs._Follow()
    jobs._take("headers: Authorization:\n", "train", state, ctx, None)
    jobs._take("\n", "train", state, ctx, None)  # blank lines between, in a chunk of their own
    jobs._take("  \n", "train", state, ctx, None)
    jobs._take("  s3cr3tV4lue-of-a-token\nnext Bearer\n", "train", state, ctx, None)
    jobs._take("\n  an0ther-t0ken-value\n", "train", state, ctx, None)
    saved = (tmp_path / "r" / "logs" / "train.log").read_text()
    assert "s3cr3tV4lue" not in saved and "an0ther" not in saved
    lines = ["headers: Authorization:", "", "  ", "  [redacted]", "next Bearer", "", "  [redacted]"]
    assert saved.splitlines() == lines

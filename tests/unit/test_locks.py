"""Every environment installs a hash-locked file: each image's ``requirements.lock`` (its Dockerfile and the local
environment alike) and ``requirements-dev.lock`` (.venv). A pin in a requirements file that its lock lacks, at
that version and with a hash, fails here: `make lock` regenerates the locks."""

from __future__ import annotations

import re

import pytest

from components.platforms.local import envs
from tests.helpers import REPO

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)")
LOCKS = {  # lock -> the requirements files it resolves
    **{f"images/{i}/{envs.LOCK_FILE}": [f"images/{i}/requirements.txt"] for i in envs.image_names()},
    "requirements-dev.lock": ["images/pipeline/requirements.txt", "requirements-dev.txt"],
    "requirements-pip.lock": ["requirements-pip.txt"],
}


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503's normalized name


def locked(text: str) -> dict[str, tuple[str, int]]:
    """The lock's entries: normalized name -> (version, how many hashes its block lists)."""
    entries: dict[str, tuple[str, int]] = {}
    name = ""
    for line in text.splitlines():
        m = PIN.match(line)
        if m:
            name = _name(m[1])
            entries[name] = (m[3], 0)
        elif name and line.strip().startswith("--hash=sha256:"):
            version, hashes = entries[name]
            entries[name] = (version, hashes + 1)
    return entries


def pins(text: str) -> dict[str, str]:
    return {_name(m[1]): m[3] for line in text.splitlines() if (m := PIN.match(line.strip()))}


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_pin_is_in_its_lock_at_its_version_and_every_entry_has_a_hash(lock):
    entries = locked((REPO / lock).read_text())
    assert entries, f"{lock} lists nothing"
    unhashed = sorted(n for n, (_, hashes) in entries.items() if not hashes)
    assert unhashed == [], f"{lock}: no --hash for {unhashed}"
    for requirements in LOCKS[lock]:
        for name, version in pins((REPO / requirements).read_text()).items():
            assert name in entries, f"{requirements} pins {name}=={version}, which {lock} lacks: run `make lock`"
            assert entries[name][0] == version, f"{lock} has {name}=={entries[name][0]}, {requirements} pins {version}"


def test_the_lock_checks_catch_a_missing_pin_and_a_missing_hash():
    entries = locked("a==1 \\\n    --hash=sha256:00\nb==2\n    # via a\n")
    assert entries == {"a": ("1", 1), "b": ("2", 0)}
    assert pins("A_B[x]==3  # why\n# c==4\n") == {"a-b": "3"}


@pytest.mark.parametrize("image", envs.image_names())
def test_each_image_installs_its_lock_by_hash_and_the_venv_its_own(image):
    dockerfile = (REPO / "images" / image / "Dockerfile").read_text()
    assert f"COPY images/{image}/{envs.LOCK_FILE} " in dockerfile
    assert re.search(r"pip install [^\n]*--require-hashes[^\n]* -r /tmp/requirements\.lock", dockerfile)
    assert not re.search(r"COPY \S*requirements\.txt", dockerfile)
    makefile = (REPO / "Makefile").read_text()
    assert "--require-hashes -r requirements-dev.lock" in makefile


def test_every_image_builds_from_its_base_by_digest_one_digest_for_all():
    """A FROM (or the ARG it names) by tag alone could build from other content than was reviewed."""
    bases = {}
    for image in envs.image_names():
        dockerfile = (REPO / "images" / image / "Dockerfile").read_text()
        args = dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile, re.M))
        (base,) = re.findall(r"^FROM (\S+)", dockerfile, re.M)
        base = args.get(base.strip("${}"), base)
        assert re.fullmatch(r"[\w./:-]+@sha256:[0-9a-f]{64}", base), (
            f"images/{image}/Dockerfile: {base} is not by digest"
        )
        bases[image] = base
    assert len(set(bases.values())) == 1, bases


def test_the_tpu_image_installs_torchs_cpu_build_by_hash_and_none_of_the_cuda_wheels(tmp_path):
    """images/torch/Dockerfile with TORCH_WHEELS=cpu (the default): its own awk program run on the lock leaves out
    torch and the wheels only PyPI's CUDA build needs, keeps everything else (torch-tpu and libtpu among it); the CPU
    build it installs instead is requirements.lock's torch version, by hash."""
    import subprocess

    dockerfile = (REPO / "images" / "torch" / "Dockerfile").read_text()
    assert re.search(r"^ARG TORCH_WHEELS=cpu$", dockerfile, re.M)
    program = re.search(r'"\$TORCH_WHEELS" = "cpu" \]; then \\\n\s+awk \'([^\']+)\'', dockerfile)[1]
    full = (REPO / "images" / "torch" / envs.LOCK_FILE).read_text()
    kept = subprocess.run(["awk", program], input=full, capture_output=True, text=True, check=True).stdout
    before, after = locked(full), locked(kept)
    dropped = sorted(set(before) - set(after))
    assert (
        "torch" in dropped
        and "triton" in dropped
        and all(n == "torch" or n == "triton" or n.startswith(("nvidia-", "cuda-")) for n in dropped)
    ), dropped
    assert {"torch-tpu", "libtpu", "transformers", "ray"} <= set(after)
    assert all(after[n] == before[n] for n in after), "a kept block lost a hash"
    cpu = locked((REPO / "images" / "torch" / "torch-cpu.lock").read_text())
    assert list(cpu) == ["torch"] and cpu["torch"] == (f"{before['torch'][0]}+cpu", 1), cpu
    assert "--index-url https://download.pytorch.org/whl/cpu" in dockerfile and "-r /tmp/torch-cpu.lock" in dockerfile

"""Local "images": one Python environment per image directory, keyed by the content hash of its files.

``images/<name>/`` holds the image's Dockerfile, its pinned requirements and their hash-locked resolution
(``requirements.lock``). Locally, building the image means creating ``.envs/<name>-<hash>/`` from those files (Python
3.12, the locked requirements, then this repository installed without dependencies, as the Dockerfile does). The
same files give the same hash, so an environment is built once and reused until its image files change.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from components.spec import InfraError, SpecError

REPO_ROOT = Path(__file__).resolve().parents[3]  # components/platforms/local/envs.py
IMAGES_DIR = REPO_ROOT / "images"
COMPLETE_MARKER = ".tpupipe-env-complete"
# What the image's Dockerfile installs: its requirements.txt resolved, every file by its hash (`make lock`).
LOCK_FILE = "requirements.lock"
# pip itself, installed before any lock (requirements-pip.txt says why); not part of an environment's content hash.
PIP_LOCK = REPO_ROOT / "requirements-pip.lock"
COMPILED_MARKER = ".tpupipe-env-compiled"  # its modules byte-compiled (an environment built before lacks it)


def envs_dir() -> Path:
    return Path(os.environ.get("TPUPIPE_ENVS_DIR", REPO_ROOT / ".envs"))


@dataclass(frozen=True)
class Env:
    image: str
    digest: str
    path: str
    reused: bool

    @property
    def python(self) -> str:
        return str(Path(self.path) / "bin" / "python")

    @property
    def bin(self) -> Path:
        return Path(self.path) / "bin"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "python": self.python}


def image_names(images: Path = IMAGES_DIR) -> list[str]:
    return sorted(p.name for p in images.iterdir() if (p / "Dockerfile").is_file())


def image_digest(image: str, images: Path = IMAGES_DIR) -> str:
    """sha256 over the image directory's files (names and bytes) and the Python minor version. ``images`` is the
    directory of image directories (default: this repository's ``images/``; a test gives a copy)."""
    directory = images / image
    if not (directory / "Dockerfile").is_file():
        raise SpecError("image", f"unknown image {image!r}", image_names(images))
    h = hashlib.sha256(f"python{sys.version_info.major}.{sys.version_info.minor}\n".encode())
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def env_for(image: str, images: Path = IMAGES_DIR) -> Env:
    digest = image_digest(image, images)
    path = envs_dir() / f"{image}-{digest}"
    return Env(image, digest, str(path), all((path / m).is_file() for m in (COMPLETE_MARKER, COMPILED_MARKER)))


def _base_python() -> str:
    """The interpreter this environment was made from (Python 3.12), to make sibling environments."""
    candidate = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(candidate) if candidate.exists() else sys.executable


def _run_logged(cmd: list[str], log: Callable[[str], None], what: str, log_file: Path, check: bool = True) -> int:
    started = time.monotonic()
    with open(log_file, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                log(f"  ... {what}: {time.monotonic() - started:.0f}s")
    if proc.returncode != 0 and check:
        tail = log_file.read_text().splitlines()[-20:]
        raise InfraError(f"{what} failed (exit {proc.returncode}); log {log_file}:\n" + "\n".join(tail))
    return proc.returncode


def ensure_env(image: str, log: Callable[[str], None] = print, images: Path = IMAGES_DIR) -> Env:
    """Create the image's environment unless one with the same content hash exists. Idempotent, and safe to call
    from processes side by side (one builds, under a file lock beside it; the others wait, then reuse). The image's
    requirements alone, and this package without dependencies, as its Dockerfile installs them: what the image lacks,
    the environment lacks."""
    import fcntl

    env = env_for(image, images)
    if env.reused:
        return _reusing(env, log)
    target = Path(env.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(f"{target.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        if env_for(image, images).reused:  # another process built it while this one waited
            return _reusing(env, log)
        if (target / COMPLETE_MARKER).is_file():  # built before environments were byte-compiled: compiled now
            _compile(image, target, log, target.with_name(f"{target.name}.log"))
            return _reusing(env_for(image, images), log)
        return _build(env, target, log, images / image / LOCK_FILE)


def _compile(image: str, target: Path, log: Callable[[str], None], log_file: Path) -> None:
    """Byte-compile the environment's packages, as the image's ``pip install`` does (images/*/Dockerfile). Without
    it, every process of a run compiles the modules it imports again wherever ``PYTHONDONTWRITEBYTECODE`` is set (it
    writes no cache): importing Ray Train, torch and transformers took 12.5 CPU-seconds instead of 5.3, in each Ray
    worker. A file that does not compile (a package's Python 2 example) is left to fail at import, as in the image."""
    python = target / "bin" / "python"
    site = target / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    cmd = [str(python), "-m", "compileall", "-q", "-j", "0", str(site)]
    if _run_logged(cmd, log, f"image {image}: byte-compile", log_file, check=False):
        log(f"image {image}: some modules did not byte-compile (see {log_file}); they compile on import")
    (target / COMPILED_MARKER).write_text("compileall\n")


def _reusing(env: Env, log: Callable[[str], None]) -> Env:
    log(f"image {env.image}: reusing environment {env.path} (content hash {env.digest})")
    return env


def _build(env: Env, target: Path, log: Callable[[str], None], requirements: Path) -> Env:
    log_file = target.with_name(f"{target.name}.log")
    log(f"image {env.image}: creating environment {target} (content hash {env.digest}); log {log_file}")
    started = time.monotonic()
    # Venvs are not relocatable, so it is made at its final path; the marker, written last, makes it count.
    shutil.rmtree(target, ignore_errors=True)
    image = env.image
    _run_logged([_base_python(), "-m", "venv", str(target)], log, f"image {image}: venv", log_file)
    # --no-compile: pip byte-compiles one module after another; _compile does it on every core, once (below).
    pip = [str(target / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--no-compile"]
    shown = requirements.relative_to(REPO_ROOT) if requirements.is_relative_to(REPO_ROOT) else requirements
    what = f"image {image}: pip install"
    _run_logged([*pip, "--require-hashes", "-r", str(PIP_LOCK)], log, f"{what} -r {PIP_LOCK.name}", log_file)
    _run_logged([*pip, "--require-hashes", "-r", str(requirements)], log, f"{what} -r {shown}", log_file)
    _run_logged([*pip, "--no-deps", "-e", str(REPO_ROOT)], log, f"{what} tpupipe", log_file)
    _compile(image, target, log, log_file)
    (target / COMPLETE_MARKER).write_text(env.digest + "\n")
    log(f"image {env.image}: environment ready in {time.monotonic() - started:.0f}s")
    return Env(env.image, env.digest, env.path, False)

"""The local registry: a directory of plain JSON files, one directory per model.

```
<root>/<name>/versions/<id>.json   one version: name, version, artifact_uri, labels, provenance, created (never changed)
<root>/<name>/aliases.json         {alias: version id}: the only file that changes
<root>/<name>/.lock                taken (flock) by every writer of the model
```

Every file is written whole: a temporary file in the same directory, then a rename, so a reader sees the old file
or the new one, never half of one. Writers of a model take its lock for the read-modify-write, so two of them
(two pipelines, a pipeline and ``tpupipe models promote``) never hand out one version id twice or lose an alias
change. Readers take no lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from components.registry import NAME, Move, Version
from components.spec import InfraError


def _write_json(path: Path, value: Any) -> None:
    """``path`` replaced whole: a temporary file beside it, flushed to disk, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(value, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:  # only a hand edit can do this: every write is whole
        raise InfraError(f"model registry: {path} is not JSON ({exc}); restore it or remove it") from None


class LocalBackend:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.where = str(self.root)

    def _model(self, name: str) -> Path:
        return self.root / name

    @contextmanager
    def _locked(self, name: str) -> Iterator[Path]:
        model = self._model(name)
        (model / "versions").mkdir(parents=True, exist_ok=True)
        with open(model / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield model
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _aliases(self, model: Path) -> dict[str, str]:
        return _read_json(model / "aliases.json") or {}

    def _version(self, model: Path, version_id: str, aliases: dict[str, str]) -> Version | None:
        record = _read_json(model / "versions" / f"{version_id}.json")
        if record is None:
            return None
        held = tuple(sorted(a for a, v in aliases.items() if v == version_id))
        return Version(
            name=record["name"],
            version=record["version"],
            artifact_uri=record["artifact_uri"],
            aliases=held,
            provenance=record["provenance"],
            labels=record["labels"],
            created=record["created"],
        )

    def _ids(self, model: Path) -> list[str]:
        versions = model / "versions"
        ids = [p.stem for p in versions.glob("*.json")] if versions.is_dir() else []
        return sorted((i for i in ids if i.isdigit()), key=int)

    def upload(self, name: str, artifact_uri: str, provenance: dict[str, Any], labels: dict[str, str]) -> Version:
        with self._locked(name) as model:
            ids = self._ids(model)
            version_id = str(int(ids[-1]) + 1 if ids else 1)
            created = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            _write_json(
                model / "versions" / f"{version_id}.json",
                {
                    "name": name,
                    "version": version_id,
                    "artifact_uri": artifact_uri,
                    "labels": labels,
                    "provenance": provenance,
                    "created": created,
                },
            )
        found = self._version(model, version_id, {})
        if found is None:
            raise InfraError(f"{self.where}: version {version_id} of {name!r} was written but is not found")
        return found

    def resource(self, name: str, version: str) -> str:
        return ""  # a directory, not a Vertex AI resource

    def fetch(self, name: str, ref: str) -> Version | None:
        model = self._model(name)
        aliases = self._aliases(model)
        version_id = ref if ref.isdigit() else aliases.get(ref)
        return self._version(model, version_id, aliases) if version_id else None

    def versions(self, name: str) -> list[Version] | None:
        model = self._model(name)
        ids = self._ids(model)
        if not ids:
            return None
        aliases = self._aliases(model)
        return [v for v in (self._version(model, i, aliases) for i in ids) if v is not None]

    def models(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if NAME.match(p.name) and self._ids(p))

    def change(self, name: str, plan: Callable[[dict[str, str]], list[Move]]) -> list[Move]:
        """Planned on the aliases read under the model's lock and written in one write of aliases.json: two writers
        are serialized, and no reader sees half of a promotion or a rollback."""
        with self._locked(name) as model:
            aliases = self._aliases(model)
            moves = plan(dict(aliases))
            if not moves:
                return moves
            for move in moves:
                for alias in move.remove:
                    if aliases.get(alias) == move.version:
                        del aliases[alias]
                for alias in move.add:
                    aliases[alias] = move.version
            _write_json(model / "aliases.json", aliases)
        return moves

"""The manifest: the commit marker of a checkpoint, written last, listing every file with its size and checksum."""

from __future__ import annotations

import json
import platform
import re
import time
import uuid
from dataclasses import dataclass, field

import torch

import runner

from .errors import CorruptCheckpointError

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
STATE_NAME = "state.pkl"
FLAT = "flat"  # one process: data parts and a skeleton (staging.py)
DCP = "dcp"    # a process group: torch.distributed.checkpoint files and .metadata (dcp_format.py)
FOLDER = "folder"  # a training framework's own checkpoint folder (folder_format.py, runner/integrations)
LAYOUTS = (FLAT, DCP, FOLDER)
_FOLDER = re.compile(r"^step-(\d{8,})$")


def folder_name(step: int) -> str:
    """``step-00001200``: zero-padded so that names sort like steps."""
    return f"step-{step:08d}"


def step_of(name: str) -> int | None:
    """The step a checkpoint folder's name encodes, or None for anything else."""
    match = _FOLDER.match(name.rstrip("/").rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


@dataclass
class Manifest:
    step: int
    files: list[dict]  # [{"name", "bytes", "checksum"}], data parts first, state.pkl last
    checksum: str
    attempt: int | None = None
    job_id: str | None = None
    emergency: bool = False
    layout: str = FLAT
    world_size: int = 1
    payload: dict | None = None  # the folder layout: who wrote it ({"framework", "version", "model", "signature"})
    created_at: float = field(default_factory=time.time)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def bytes(self) -> int:
        return sum(f["bytes"] for f in self.files)

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT_VERSION,
            "id": self.id,
            "step": self.step,
            "attempt": self.attempt,
            "job_id": self.job_id,
            "emergency": self.emergency,
            "layout": self.layout,
            "world_size": self.world_size,
            **({"payload": self.payload} if self.payload is not None else {}),
            "created_at": self.created_at,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created_at)),
            "checksum": self.checksum,
            "bytes": self.bytes,
            "files": self.files,
            "versions": {
                "runner": runner.__version__,
                "torch": torch.__version__,
                "python": platform.python_version(),
            },
        }
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> "Manifest":
        """Parse a manifest; raise CorruptCheckpointError naming ``where`` when it is not a complete one."""
        try:
            doc = json.loads(data)
            if doc["format"] != FORMAT_VERSION:
                raise CorruptCheckpointError(f"{where}: manifest format {doc['format']} is not {FORMAT_VERSION}")
            files = [{"name": str(f["name"]), "bytes": int(f["bytes"]), "checksum": str(f["checksum"])}
                     for f in doc["files"]]
            for entry in files:  # a manifest names files inside its own folder, nothing else
                if not entry["name"] or "/" in entry["name"] or "\\" in entry["name"] or entry["name"] in (".", ".."):
                    raise CorruptCheckpointError(f"{where}: file name {entry['name']!r} is not inside the checkpoint")
            layout = str(doc.get("layout", FLAT))
            if layout not in LAYOUTS:
                raise CorruptCheckpointError(f"{where}: unknown layout {layout!r}; a newer runner wrote it")
            return cls(step=int(doc["step"]), files=files, checksum=str(doc["checksum"]),
                       attempt=doc.get("attempt"), job_id=doc.get("job_id"),
                       emergency=bool(doc.get("emergency")), layout=layout,
                       world_size=int(doc.get("world_size", 1)),
                       payload=doc["payload"] if isinstance(doc.get("payload"), dict) else None, created_at=float(doc["created_at"]),
                       id=str(doc["id"]))
        except CorruptCheckpointError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptCheckpointError(f"{where}: unreadable manifest ({exc})") from exc

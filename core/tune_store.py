"""The tune store: a directory of measured decisions, one JSON file per (device tune key, decision key,
build id), each holding the candidates' medians and the verdict (tuning/probes.py measures it).

An entry is believed only for the device it was measured on (DeviceFacts.tune_key: backend plus the
geometry that changes the answer) and the kernel build it measured (the build id: a hash of the
sources); both are in the file name and checked again inside, so an entry copied from another machine
or left by another build is ignored, never believed. Writers write a temporary file and rename it over
the entry, so a reader sees a whole entry or none, however many processes tune at once; an entry that
does not read back (truncated, garbage, wrong fields) is reported as such, and the caller re-measures
and replaces it.

Where: `--tune-dir DIR`, else $LLMPLAN_TUNE_DIR, else the platform's cache directory; "off" keeps
no store (nothing read, nothing written).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENTRY_FORMAT = 1
TIE = 0.03  # a lead under this is noise: the default stands
MAX_ENTRY_BYTES = 1 << 20  # far above any real entry: a bigger file is not one of ours
OFF = "off"


def default_dir() -> Path:
    """The platform's per-user cache directory for llmplan's tune entries."""
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "llmplan" / "tune"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or home / "AppData" / "Local") / "llmplan" / "Cache" / "tune"
    return Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "llmplan" / "tune"


def resolve(flag: str | None) -> Path | None:
    """The store directory `--tune-dir` (flag), $LLMPLAN_TUNE_DIR or the platform name; None when off."""
    where = flag if flag is not None else os.environ.get("LLMPLAN_TUNE_DIR")
    if where is None or where == "":
        return default_dir()
    return None if where == OFF else Path(where)


@dataclass(frozen=True)
class Lookup:
    """What the store holds for one key: `entry` when it is usable, else `why` not."""

    id: str
    entry: dict[str, Any] | None
    why: str  # "missing", "off", or what was wrong with the file


class TuneStore:
    def __init__(self, root: str | os.PathLike | None):
        self.root = Path(root) if root is not None else None

    @classmethod
    def from_flag(cls, flag: str | None) -> TuneStore:
        return cls(resolve(flag))

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def describe(self) -> str:
        return str(self.root) if self.root is not None else "off"

    @staticmethod
    def entry_id(device_key: str, decision_key: str, build_id: str) -> str:
        return hashlib.sha256("\0".join([device_key, decision_key, build_id]).encode()).hexdigest()[:16]

    def path(self, entry_id: str) -> Path:
        assert self.root is not None
        return self.root / f"{entry_id}.json"

    def load(self, device_key: str, decision_key: str, build_id: str) -> Lookup:
        eid = self.entry_id(device_key, decision_key, build_id)
        if self.root is None:
            return Lookup(eid, None, OFF)
        try:
            with open(self.path(eid), "rb") as f:
                raw = f.read(MAX_ENTRY_BYTES + 1)
        except FileNotFoundError:
            return Lookup(eid, None, "missing")
        except OSError as e:
            return Lookup(eid, None, f"unreadable ({e.strerror or type(e).__name__})")
        why = _invalid(raw, device_key, decision_key, build_id)
        if why:
            return Lookup(eid, None, why)
        return Lookup(eid, json.loads(raw), "")

    def save(self, entry: dict[str, Any]) -> str:
        """Write `entry` atomically (temporary file, then rename); returns its id. With the store off
        nothing is written and the id is the one the entry would have."""
        assert not _invalid(json.dumps(entry).encode(), entry["device_key"], entry["decision_key"], entry["build_id"])
        eid = self.entry_id(entry["device_key"], entry["decision_key"], entry["build_id"])
        if self.root is None:
            return eid
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{eid}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(eid))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return eid


def _invalid(raw: bytes, device_key: str, decision_key: str, build_id: str) -> str:
    """Why `raw` is not a usable entry for these keys, or ""."""
    if len(raw) > MAX_ENTRY_BYTES:
        return "corrupt (too large)"
    try:
        e = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return "corrupt (not JSON: truncated or garbage)"
    if not isinstance(e, dict) or e.get("format") != ENTRY_FORMAT:
        return f"corrupt (not a format-{ENTRY_FORMAT} entry)"
    if e.get("device_key") != device_key:
        return f"ignored: measured on another device ({str(e.get('device_key'))[:80]})"
    if e.get("build_id") != build_id:
        return "ignored: measured another kernel build"
    if e.get("decision_key") != decision_key:
        return "ignored: an entry for another decision"
    medians = e.get("medians")
    if not (isinstance(medians, dict) and medians
            and all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in medians.values())):
        return "corrupt (medians)"
    names = [e.get("winner"), e.get("default")]
    if not (all(isinstance(n, str) and n in medians for n in names)
            and isinstance(e.get("lead"), (int, float)) and isinstance(e.get("tie"), bool)
            and isinstance(e.get("rejected", {}), dict)):
        return "corrupt (verdict)"
    return ""


@dataclass(frozen=True)
class Verdict:
    """What a probe measured for one decision (tuning/probes.py), as an entry keeps it."""

    medians: dict[str, float]  # seconds per call
    rejected: dict[str, str]  # candidate -> why its output was refused
    default: str
    winner: str
    lead: float  # winner vs the default (or the default vs the next best, when it wins)
    tie: bool
    calls: int  # per candidate per round
    rounds: int


def record(v: Verdict, device_key: str, decision_key: str, build_id: str) -> dict[str, Any]:
    """The store entry of a verdict."""
    return {"format": ENTRY_FORMAT, "device_key": device_key, "decision_key": decision_key, "build_id": build_id,
            "medians": v.medians, "rejected": v.rejected, "default": v.default, "winner": v.winner, "lead": v.lead,
            "tie": v.tie, "rounds": v.rounds, "calls": v.calls,
            "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def provenance(entry_id: str, entry: dict[str, Any]) -> str:
    """How a plan records a decision taken from a store entry."""
    lead = f"{entry['lead']:.0%}"
    if entry["tie"]:
        return f"tie: entry {entry_id}, the fastest within {TIE:.0%} of the default {entry['default']}, which stands"
    if entry["winner"] == entry["default"]:
        return f"measured: entry {entry_id}, the default is fastest, lead {lead}"
    return f"measured: entry {entry_id}, lead {lead} over the default {entry['default']}"

"""Fitted state as a verified folder of plain files: no pickle, nothing that runs code on load.

A state folder holds JSON (configs, scalars, tables), numpy `.npy` (arrays,
`allow_pickle=False`), text (LightGBM models) and parquet (frames), plus the
index `state.json`: its format, format version and the SHA-256 and size of
every other file. `StateWriter` writes one (into a temporary sibling, renamed
into place once the index is written); each fitted object writes its own part
(`write_state(writer)` / `read_state(reader)` next to the class, a
sub-folder per object).

`read_state_folder` checks the whole folder BEFORE parsing any of it: the
folder and every entry are plain directories and files (no symlink, device or
pipe), the index names exactly the files present (none missing, none extra),
every name is a safe relative path with a known suffix, no file is a pickle
(a `.pkl` / `.pickle` / `.joblib` name, or bytes opening with the pickle
protocol header 0x80), and every file's SHA-256 matches. The bytes are read
once, into memory, and parsed from there (what was hashed is what is parsed).
Any failure is one `RunStateError` line.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.contracts.errors import InputError

INDEX = "state.json"
SUFFIXES = (".json", ".npy", ".txt", ".parquet")  # every kind of file a state may hold
PICKLE_SUFFIXES = (".pkl", ".pickle", ".joblib", ".dill", ".cloudpickle", ".npz")
PICKLE_HEADER = b"\x80"  # PROTO opcode: every pickle of protocol 2 or later starts with it
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_FLOAT = "$float"  # JSON has no inf / nan: {"$float": "inf"}


class RunStateError(InputError, ValueError):
    """A state folder cannot be written or read back (the message says why, in one line)."""


# ---------------------------------------------------------------- JSON with exact floats
def _encode(tree: Any, where: str) -> Any:
    """JSON-ready copy: numpy scalars -> Python, tuples -> lists, non-finite floats tagged."""
    if isinstance(tree, np.generic):
        tree = tree.item()
    if tree is None or isinstance(tree, bool | int | str):
        return tree
    if isinstance(tree, float):
        return float(tree) if math.isfinite(tree) else {_FLOAT: repr(float(tree))}
    if isinstance(tree, dict):
        if not all(isinstance(k, str) for k in tree):
            raise RunStateError(f"{where}: JSON state needs string keys, got {list(tree)[:5]}")
        return {k: _encode(v, where) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return [_encode(v, where) for v in tree]
    raise RunStateError(f"{where}: a {type(tree).__name__} cannot be stored as JSON state")


def _decode_float(obj: dict) -> Any:
    if set(obj) == {_FLOAT}:
        if obj[_FLOAT] not in ("inf", "-inf", "nan"):
            raise RunStateError(f"bad tagged float {obj[_FLOAT]!r}")
        return float(obj[_FLOAT])
    return obj


def _check_name(name: str) -> str:
    """A safe relative path: '/'-separated plain names, no '..', no leading dot or slash."""
    parts = name.split("/")
    if not name or any(not _NAME.fullmatch(p) or p in (".", "..") for p in parts):
        raise RunStateError(f"{name!r} is not a safe relative path inside a state folder")
    return name


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- writing
class StateWriter:
    """Writes the files of one state folder; `sub(name)` writes under a sub-folder."""

    def __init__(self, root: Path, prefix: str = "", files: dict[str, dict] | None = None):
        self._root = Path(root)
        self._prefix = prefix
        self._files: dict[str, dict] = {} if files is None else files

    def sub(self, name: str) -> StateWriter:
        return StateWriter(self._root, self._prefix + _check_name(name) + "/", self._files)

    def _put(self, name: str, data: bytes) -> None:
        rel = _check_name(self._prefix + name)
        if not rel.endswith(SUFFIXES):
            raise RunStateError(f"{rel}: a state file must end in one of {', '.join(SUFFIXES)}")
        if rel in self._files:
            raise RunStateError(f"{rel}: written twice")
        path = self._root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self._files[rel] = {"sha256": _sha256(data), "size": len(data)}

    def put_json(self, name: str, obj: Any) -> None:
        text = json.dumps(_encode(obj, self._prefix + name), indent=1, allow_nan=False)
        self._put(name, (text + "\n").encode())

    def put_text(self, name: str, text: str) -> None:
        self._put(name, text.encode())

    def put_array(self, name: str, array: np.ndarray) -> None:
        array = np.asarray(array)
        if array.dtype.hasobject or array.dtype.kind not in "biuf":
            raise RunStateError(f"{self._prefix + name}: only bool / int / float arrays are "
                                f"stored, not {array.dtype}")
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        self._put(name, buf.getvalue())

    def put_frame(self, name: str, frame: Any) -> None:
        buf = io.BytesIO()
        frame.to_parquet(buf)
        self._put(name, buf.getvalue())


def write_state_folder(path: Path, kind: str, version: int, fill) -> Path:
    """Write the state folder `path` (replacing one there): `fill(writer)` writes its files.

    Written into a temporary sibling and renamed into place once `state.json` is
    written, so a failed `fill` (e.g. an object with no pickle-free state) leaves
    the previous folder or nothing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        writer = StateWriter(tmp)
        fill(writer)
        index = {"format": kind, "version": int(version),
                 "files": dict(sorted(writer._files.items()))}
        (tmp / INDEX).write_text(json.dumps(index, indent=1) + "\n")
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


# ---------------------------------------------------------------- reading
def _read_plain(path: Path, where: str) -> bytes:
    """A regular file's bytes, never through a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise RunStateError(f"{where}: cannot read {path.name}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise RunStateError(f"{where}: {path.name} is not a regular file")
        return f.read()


def _refuse_pickle(rel: str, data: bytes | None, where: str) -> None:
    if rel.lower().endswith(PICKLE_SUFFIXES):
        raise RunStateError(f"{where}: holds {rel}, a pickle; refused, never loaded (re-run "
                            "training to save the run state as plain files)")
    if data is not None and data[:1] == PICKLE_HEADER:
        raise RunStateError(f"{where}: {rel} is a pickle (starts with 0x80); refused, "
                            "never loaded")


def _present_files(root: Path, where: str) -> list[str]:
    """Every file under root as a relative posix path; refuses symlinks and special files."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            mode = os.lstat(p).st_mode
            if stat.S_ISLNK(mode):
                raise RunStateError(f"{where}: {rel} is a symlink; refused")
            if name in filenames:
                _refuse_pickle(rel, None, where)
                if not stat.S_ISREG(mode):
                    raise RunStateError(f"{where}: {rel} is not a regular file; refused")
                found.append(rel)
            elif not stat.S_ISDIR(mode):
                raise RunStateError(f"{where}: {rel} is not a regular file; refused")
    return sorted(found)


class StateReader:
    """The verified files of one state folder, parsed on demand from memory."""

    def __init__(self, blobs: dict[str, bytes], prefix: str = "", where: str = "state"):
        self._blobs = blobs
        self._prefix = prefix
        self.where = where

    def sub(self, name: str) -> StateReader:
        return StateReader(self._blobs, self._prefix + _check_name(name) + "/", self.where)

    def has(self, name: str) -> bool:
        return (self._prefix + name) in self._blobs

    def _get(self, name: str) -> bytes:
        rel = self._prefix + name
        if rel not in self._blobs:
            raise RunStateError(f"{self.where}: {rel} is missing from the state")
        return self._blobs[rel]

    def get_json(self, name: str) -> Any:
        try:
            return json.loads(self._get(name), object_hook=_decode_float)
        except (ValueError, UnicodeDecodeError) as e:
            if isinstance(e, RunStateError):
                raise
            raise RunStateError(f"{self.where}: {self._prefix + name}: not JSON: {e}") from None

    def get_text(self, name: str) -> str:
        try:
            return self._get(name).decode()
        except UnicodeDecodeError as e:
            raise RunStateError(f"{self.where}: {self._prefix + name}: not UTF-8: {e}") from None

    def get_array(self, name: str) -> np.ndarray:
        try:
            return np.load(io.BytesIO(self._get(name)), allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise RunStateError(f"{self.where}: {self._prefix + name}: not a plain .npy "
                                f"array: {e}") from None

    def get_frame(self, name: str) -> Any:
        import pandas as pd

        try:
            return pd.read_parquet(io.BytesIO(self._get(name)))
        except Exception as e:  # pyarrow's errors: a corrupt or foreign file
            raise RunStateError(f"{self.where}: {self._prefix + name}: not parquet: "
                                f"{type(e).__name__}: {e}") from None


def read_state_folder(path: Path, kind: str, version: int) -> StateReader:
    """Verify the state folder `path` as a whole (module docstring), then a reader of it.

    FileNotFoundError when there is no folder; RunStateError on anything else wrong.
    """
    path = Path(path)
    where = str(path)
    if path.is_symlink():
        raise RunStateError(f"{where}: the state folder is a symlink; refused")
    if not path.is_dir():
        raise FileNotFoundError(f"{where}: no state folder here")
    present = _present_files(path, where)
    if INDEX not in present:
        raise RunStateError(f"{where}: no {INDEX} (the index of the state's files)")
    raw = _read_plain(path / INDEX, where)
    _refuse_pickle(INDEX, raw, where)
    try:
        index = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RunStateError(f"{where}: {INDEX} is not JSON: {e}") from None
    if not isinstance(index, dict) or index.get("format") != kind:
        got = index.get("format") if isinstance(index, dict) else None
        raise RunStateError(f"{where}: {INDEX} is not a {kind} state (format {got!r})")
    if index.get("version") != version:
        raise RunStateError(f"{where}: {kind} state version {index.get('version')!r}; this "
                            f"version of replaylab reads version {version}")
    files = index.get("files")
    if not isinstance(files, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("sha256"), str) for v in files.values()):
        raise RunStateError(f"{where}: {INDEX} has no valid files table")
    for rel in files:
        _check_name(rel)
        _refuse_pickle(rel, None, where)
        if not rel.endswith(SUFFIXES) or rel == INDEX:
            raise RunStateError(f"{where}: {INDEX} names {rel!r}, not a kind of state file")
    listed, on_disk = set(files), set(present) - {INDEX}
    if on_disk - listed:
        raise RunStateError(f"{where}: file(s) not in {INDEX}: "
                            f"{', '.join(sorted(on_disk - listed))}; refused")
    if listed - on_disk:
        raise RunStateError(f"{where}: file(s) named in {INDEX} are missing: "
                            f"{', '.join(sorted(listed - on_disk))}")
    blobs = {}
    for rel in sorted(files):
        data = _read_plain(path / rel, where)
        _refuse_pickle(rel, data, where)
        if _sha256(data) != files[rel]["sha256"]:
            raise RunStateError(f"{where}: {rel} does not match its SHA-256 in {INDEX} "
                                "(changed or corrupt); refused")
        blobs[rel] = data
    return StateReader(blobs, where=where)

"""Artifact manifests (schema 1): build, write (optionally HMAC-signed), verify.

Standard library only (json, hashlib, hmac, pathlib, datetime): the serving
runtime imports this module without numpy/pandas/lightgbm/onnx. See
`docs/specs/artifacts.md`, section "Manifest (schema 1)".

`verify_manifest` raises `ManifestError(reason_code, message)`; the reason code
is a short stable string meant for the runtime's `hint_fallback` reason.
Files present in the folder but not listed are ignored by verification and must
never be loaded: the runtime reads artifact files only through
`read_verified_file`, which reads the bytes once and checks size and sha256 on
those same bytes (no check-then-open race).

Whatever bytes `manifest.json` holds (not JSON, 100,000 nested arrays, 1e400,
a lone surrogate, a date past year 9999, a path too long for the filesystem),
`verify_manifest` raises `ManifestError` with one of `REASON_CODES`, never
another exception. Files and folders written here get the modes the process
umask gives (0644 / 0755 under umask 022), like any other file the exporter
writes, so a serving user other than the deploying one can read them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from replaylab.contracts.errors import InputError

MANIFEST_SCHEMA_VERSION = "1"
MANIFEST_NAME = "manifest.json"
MAX_CLOCK_SKEW = timedelta(minutes=5)
SIGNATURE_PREFIX = "hmac-sha256:"
HASH_PREFIX = "sha256:"
_CHUNK = 1 << 20
# A manifest is a few KB (a 16 MiB one is not a manifest; reading it is refused,
# not attempted: the bytes would be held in memory twice while parsing).
MAX_MANIFEST_BYTES = 16 << 20
_SEMVER = re.compile(r"^\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.+-]+)?$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")

# Every top-level field of schema 1 and its JSON type ("signature" is optional).
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema_version": str, "kind": str, "version": str, "content_hash": str,
    "created_at": str, "valid_until": str, "contracts": dict, "features": list,
    "outputs": dict, "calibration": dict, "training": dict, "runtime": dict,
    "fallback": dict, "files": list,
}

REASON_CODES = (
    "unreadable",        # manifest.json missing, not readable, or over MAX_MANIFEST_BYTES
    "invalid_json",      # not JSON, not an object, NaN/Infinity/1e400, nesting too deep,
                         # a lone surrogate (not canonical-encodable)
    "schema_version",    # schema_version missing or not "1"
    "malformed",         # a required field missing / wrong type, bad files entry, bad date
    "missing_signature",  # a key was given but the manifest has no signature
    "bad_signature",     # signature does not match (wrong key or edited manifest)
    "kind",              # kind differs from required_kind
    "content_hash",      # content_hash differs from files+features+outputs+calibration
                         # +training
    "expired",           # now > valid_until
    "future_created",    # created_at > now + MAX_CLOCK_SKEW
    "path_escape",       # absolute path, '..', or symlink resolving outside the folder
    "missing_file",      # a listed file does not exist
    "not_a_file",        # a listed path is a directory, other non-regular file, a symlink
                         # loop, or cannot be read (permissions, name too long)
    "size_mismatch",     # size differs from the listed size
    "hash_mismatch",     # sha256 differs from the listed sha256
    "not_listed",        # read_verified_file asked for a name the manifest does not list
)


class ManifestError(InputError):
    """An artifact failed verification; `reason` is one of `REASON_CODES`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


def canonical_json(obj: Any) -> bytes:
    """Canonical encoding: sorted keys, no whitespace, UTF-8, no NaN/Infinity.

    The one canonical form of the project: artifact manifests and the fleet's
    signed recommendations (`replaylab.contracts.events`) are signed over it.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def hmac_sha256(obj: Any, key: bytes) -> str:
    """Hex HMAC-SHA256 of `canonical_json(obj)` with `key` (bytes).

    The one signing helper: manifests (`signature` = "hmac-sha256:" + this) and
    fleet recommendations (`replaylab.contracts.events.sign_recommendation`) use it.
    The key is always handed in by the caller, never read here.
    """
    return hmac.new(key, canonical_json(obj), hashlib.sha256).hexdigest()


def hmac_sha256_matches(obj: Any, key: bytes, signature: Any) -> bool:
    """True when `signature` (hex) is `hmac_sha256(obj, key)`; compared in constant time.
    A signature that is not a string, or a body that is not canonical JSON, is False."""
    if not isinstance(signature, str) or not signature:
        return False
    try:
        expected = hmac_sha256(obj, key)
    except (TypeError, ValueError):
        return False
    return _same(expected, signature)


def _same(a: str, b: str) -> bool:
    """`hmac.compare_digest` of two strings, any characters (it refuses non-ASCII str)."""
    return hmac.compare_digest(a.encode("utf-8", "surrogatepass"),
                               b.encode("utf-8", "surrogatepass"))


# The fields `content_hash` covers. `training` is among them: it holds the gate's
# decision (rule, verdict, reasons, intervals, objective), so editing the verdict of a
# registered artifact changes its hash even when the manifest is not signed.
HASHED_FIELDS = ("files", "features", "outputs", "calibration", "training")


def content_hash(manifest: dict) -> str:
    """`sha256:` + hex of canonical JSON of {files, features, outputs, calibration,
    training} (`HASHED_FIELDS`)."""
    body = {k: manifest[k] for k in HASHED_FIELDS}
    return HASH_PREFIX + hashlib.sha256(canonical_json(body)).hexdigest()


def _signature(manifest: dict, key: bytes) -> str:
    body = {k: v for k, v in manifest.items() if k != "signature"}
    return SIGNATURE_PREFIX + hmac_sha256(body, key)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _utc(dt: datetime, what: str) -> datetime:
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware")
    return dt.astimezone(UTC)


def _iso(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def build_manifest(folder: Path, *, kind: str, version: str, contracts: dict,
                   valid_days: float, features: list[dict], outputs: dict,
                   calibration: dict, training: dict, runtime: dict, fallback: dict,
                   created: datetime | None = None) -> dict:
    """The schema-1 manifest of every regular file under `folder` (recursively,
    except `manifest.json` at the top). Symlinks are refused (ValueError)."""
    folder = Path(folder)
    if not kind or not isinstance(kind, str):
        raise ValueError("kind must be a non-empty string")
    if not isinstance(version, str) or not _SEMVER.match(version):
        raise ValueError(f"version must be a semantic version, got {version!r}")
    if not (isinstance(valid_days, int | float) and math.isfinite(valid_days)
            and valid_days > 0):
        raise ValueError(f"valid_days must be a positive finite number, got {valid_days!r}")
    created_at = _utc(created, "created") if created is not None else datetime.now(UTC)
    files = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            raise ValueError(f"refusing symlink in artifact folder: {rel}")
        if path.is_dir() or rel == MANIFEST_NAME:
            continue
        if not path.is_file():
            raise ValueError(f"not a regular file: {rel}")
        files.append({"path": rel, "sha256": _sha256_file(path),
                      "size": path.stat().st_size})
    manifest = {
        "schema_version": MANIFEST_SCHEMA_VERSION, "kind": kind, "version": version,
        "contracts": contracts, "features": features, "outputs": outputs,
        "calibration": calibration, "training": training, "runtime": runtime,
        "fallback": fallback, "files": files,
        "created_at": _iso(created_at),
        "valid_until": _iso(created_at + timedelta(days=valid_days)),
    }
    manifest["content_hash"] = content_hash(manifest)
    canonical_json(manifest)  # fail early on NaN / non-JSON values
    return manifest


def _create_temp_file(folder: Path, prefix: str, suffix: str) -> tuple[int, Path]:
    """Like `tempfile.mkstemp` (a new file, O_EXCL), but with mode 0666 less the umask
    (mkstemp's is 0600 whatever the umask, and a manifest must be readable by the
    serving user). The kernel applies the umask: nothing reads or changes it here."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = folder / f"{prefix}{secrets.token_hex(8)}{suffix}"
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name {prefix}*{suffix} in {folder}")


def _create_temp_dir(parent: Path, prefix: str) -> Path:
    """Like `tempfile.mkdtemp`, but with mode 0777 less the umask (mkdtemp's is 0700):
    the published artifact folder is this folder, renamed."""
    for _ in range(100):
        path = parent / f"{prefix}{secrets.token_hex(8)}"
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name {prefix}* in {parent}")


def write_manifest(folder: Path, manifest: dict, *, hmac_key: bytes | None = None) -> Path:
    """Write `folder/manifest.json` atomically as canonical JSON (+ newline).
    With `hmac_key`, adds `signature` = HMAC-SHA256 of the canonical JSON of the
    manifest without `signature`. The file's mode is 0666 less the umask."""
    folder = Path(folder)
    manifest = {k: v for k, v in manifest.items() if k != "signature"}
    if hmac_key is not None:
        manifest["signature"] = _signature(manifest, hmac_key)
    data = canonical_json(manifest) + b"\n"
    target = folder / MANIFEST_NAME
    fd, tmp = _create_temp_file(folder, ".manifest.", ".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in manifest")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as inf without a parse_constant call
        raise ValueError(f"number {text[:40]} overflows a double")
    return value


def _read_manifest_json(folder: Path) -> dict:
    """`folder/manifest.json` as a dict that canonical_json can encode, or ManifestError."""
    try:
        with (folder / MANIFEST_NAME).open("rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError("unreadable", f"cannot read manifest: {exc}") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError("unreadable", f"manifest is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant,
                              parse_float=_finite_float)
    except RecursionError:
        raise ManifestError("invalid_json", "manifest JSON is nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:  # also ints over 4300 digits
        raise ManifestError("invalid_json",
                            f"manifest is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(manifest, dict):
        raise ManifestError("invalid_json", "manifest is not a JSON object")
    try:  # hashes and signatures are over the canonical form: it must exist
        canonical_json(manifest)
    except (ValueError, RecursionError) as exc:  # a lone surrogate (UnicodeEncodeError)
        raise ManifestError("invalid_json",
                            f"manifest has no canonical encoding: {str(exc)[:200]}") from None
    return manifest


def _parse_time(manifest: dict, field: str) -> datetime:
    try:
        dt = datetime.fromisoformat(manifest[field])
    except ValueError as exc:
        raise ManifestError("malformed", f"{field} is not ISO 8601: {str(exc)[:200]}") from None
    if dt.tzinfo is None:
        raise ManifestError("malformed", f"{field} has no timezone")
    try:
        return dt.astimezone(UTC)
    except OverflowError:  # e.g. 9999-12-31T23:59:59-14:00 is past datetime.max in UTC
        raise ManifestError("malformed", f"{field} is out of range in UTC") from None


def _check_structure(manifest: dict) -> None:
    for field, typ in _FIELDS.items():
        if field not in manifest:
            raise ManifestError("malformed", f"missing field {field!r}")
        if not isinstance(manifest[field], typ):
            raise ManifestError("malformed", f"field {field!r} has the wrong type")
    if "signature" in manifest and not isinstance(manifest["signature"], str):
        raise ManifestError("malformed", "signature is not a string")
    seen = set()
    for entry in manifest["files"]:
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)
                and isinstance(entry.get("sha256"), str) and _HEX64.fullmatch(entry["sha256"])
                and type(entry.get("size")) is int and entry["size"] >= 0):
            raise ManifestError("malformed", f"bad files entry {entry!r}"[:300])
        if entry["path"] in seen:
            raise ManifestError("malformed", f"duplicate path {entry['path']!r}"[:300])
        seen.add(entry["path"])


def _resolve_inside(folder: Path, rel: str) -> Path:
    """`folder/rel` after checking that it cannot leave the folder."""
    pure = PurePosixPath(rel)
    if (not rel or "\\" in rel or "\x00" in rel or pure.is_absolute()
            or PureWindowsPath(rel).is_absolute() or PureWindowsPath(rel).drive
            or any(part in ("..", ".", "") for part in rel.split("/"))):
        raise ManifestError("path_escape", f"path {rel!r} is absolute or leaves the folder")
    path = folder / pure
    try:
        inside = path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before 3.13)
        raise ManifestError("not_a_file", f"path {rel!r} does not resolve: {exc}"[:300]) from None
    if not inside:
        raise ManifestError("path_escape", f"path {rel!r} resolves outside the folder")
    return path


def verify_manifest(folder: Path, *, hmac_key: bytes | None = None,
                    now: datetime | None = None, required_kind: str | None = None) -> dict:
    """Check `folder/manifest.json` and every listed file; return the manifest.

    Order: readable JSON object -> schema_version -> structure -> signature
    (only when `hmac_key` is given; without a key a signature is not checked)
    -> kind -> content_hash -> validity period -> each file (path, exists,
    regular, size, sha256). Unlisted files are ignored (never load them).
    """
    folder = Path(folder)
    now = _utc(now, "now") if now is not None else datetime.now(UTC)
    manifest = _read_manifest_json(folder)
    if manifest.get("schema_version") != MANIFEST_SCHEMA_VERSION:
        raise ManifestError("schema_version",
                            f"unsupported schema_version {manifest.get('schema_version')!r}"[:300])
    _check_structure(manifest)

    if hmac_key is not None:
        if "signature" not in manifest:
            raise ManifestError("missing_signature", "a key was given but the manifest is unsigned")
        if not _same(manifest["signature"], _signature(manifest, hmac_key)):
            raise ManifestError("bad_signature", "manifest signature does not match")
    if required_kind is not None and manifest["kind"] != required_kind:
        raise ManifestError("kind",
                            f"kind {manifest['kind'][:100]!r}, expected {required_kind!r}")
    if not _same(manifest["content_hash"], content_hash(manifest)):
        raise ManifestError("content_hash", "content_hash does not match the manifest body")

    created_at = _parse_time(manifest, "created_at")
    valid_until = _parse_time(manifest, "valid_until")
    if created_at > now + MAX_CLOCK_SKEW:
        raise ManifestError("future_created", f"created_at {manifest['created_at']} is in the future")
    if now > valid_until:
        raise ManifestError("expired", f"artifact expired at {manifest['valid_until']}")

    for entry in manifest["files"]:
        _verify_file(folder, entry)
    return manifest


def _verify_file(folder: Path, entry: dict) -> None:
    name = repr(entry["path"])[:200]
    path = _resolve_inside(folder, entry["path"])
    try:
        if not path.exists():
            raise ManifestError("missing_file", f"listed file {name} is missing")
        if not path.is_file():
            raise ManifestError("not_a_file", f"{name} is not a regular file")
        size = path.stat().st_size
        if size != entry["size"]:
            raise ManifestError("size_mismatch", f"{name}: size {size}, listed {entry['size']}")
        digest = _sha256_file(path)
    except OSError as exc:  # a name too long, no permission to read, ...
        raise ManifestError("not_a_file", f"cannot read {name}: {exc.strerror}") from None
    if not _same(digest, entry["sha256"]):
        raise ManifestError("hash_mismatch", f"{name}: sha256 differs")


def read_verified_file(folder: Path, manifest: dict, name: str) -> bytes:
    """The bytes of listed file `name`, checked (size, sha256) on the bytes returned.

    Use this to load artifact files after `verify_manifest`: the bytes handed to
    e.g. `onnxruntime.InferenceSession(bytes)` are exactly the verified ones.
    """
    entry = next((e for e in manifest["files"] if e["path"] == name), None)
    if entry is None:
        raise ManifestError("not_listed", f"{name!r} is not listed in the manifest")
    path = _resolve_inside(Path(folder), name)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError("missing_file", f"listed file {name!r} is missing") from None
    except OSError as exc:
        raise ManifestError("not_a_file", f"cannot read {name!r}: {exc}") from None
    if len(data) != entry["size"]:
        raise ManifestError("size_mismatch", f"{name!r}: size {len(data)}, listed {entry['size']}")
    if not _same(hashlib.sha256(data).hexdigest(), entry["sha256"]):
        raise ManifestError("hash_mismatch", f"{name!r}: sha256 differs")
    return data


def publish_folder(tmp: Path, out_dir: Path, *, overwrite: bool = True) -> None:
    """Rename the finished folder `tmp` to `out_dir` (a sibling, so one rename).

    An existing `out_dir` is moved aside first and then removed: a reader sees
    the old folder or the new one, never a mix; between the two renames the
    path is briefly absent (a loader then falls back). With `overwrite=False`
    an existing `out_dir` is a FileExistsError instead.
    """
    tmp, out_dir = Path(tmp), Path(out_dir)
    if not out_dir.exists():
        os.replace(tmp, out_dir)
        return
    if not overwrite:
        raise FileExistsError(f"{out_dir} exists (pass overwrite=True to replace it)")
    old = _create_temp_dir(out_dir.parent, f".{out_dir.name}.old-")
    os.replace(out_dir, old / out_dir.name)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """Hard-link `src` to `dst` (same filesystem: no bytes copied), else copy it.

    Artifact files are written once and never edited in place, so a link is a
    safe copy; `dst`'s folder is created. Usable as `shutil.copytree`'s copy_function.
    """
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@contextmanager
def staged_folder(out_dir: Path, *, overwrite: bool = True) -> Iterator[Path]:
    """A temporary sibling folder of `out_dir` to write an artifact into.

    On a normal exit it is published as `out_dir` (`publish_folder`, checked
    against `overwrite` at that moment); on an
    exception it is removed. A process killed inside the block leaves only the
    temporary `.<name>.tmp-*` folder, never a half-written `out_dir`. The folder's
    mode is 0777 less the umask (0755 under 022), as `mkdir` gives: it becomes `out_dir`.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temp_dir(out_dir.parent, f".{out_dir.name}.tmp-")
    try:
        yield tmp
        publish_folder(tmp, out_dir, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

"""Artifact manifest (schema 1): round trip and every verification failure."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaylab.contracts.manifest import (
    MANIFEST_SCHEMA_VERSION,
    REASON_CODES,
    ManifestError,
    build_manifest,
    canonical_json,
    read_verified_file,
    staged_folder,
    verify_manifest,
    write_manifest,
)

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
KEY = b"test-key-0123456789"


def _make(folder: Path, *, key: bytes | None = None, kind: str = "demand",
          valid_days: float = 30) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(bytes(range(256)) * 4)
    (folder / "sub").mkdir(exist_ok=True)
    (folder / "sub" / "vocab.json").write_text('{"a": [1, 2, 3]}')
    (folder / "empty.bin").write_bytes(b"")
    manifest = build_manifest(
        folder, kind=kind, version="1.2.3", contracts={"ledger": "1"},
        valid_days=valid_days,
        features=[{"name": "x", "dtype": "float64"},
                  {"name": "c", "dtype": "category", "categories": ["a", "b"]}],
        outputs={"quantiles": [0.5, 0.9], "interval": [0.1, 0.9]},
        calibration={"groups": {"code": 0.25, "conv": -1.5}},
        training={"mlflow_run_id": "abc", "rows": 123},
        runtime={"onnxruntime": ">=1.17", "opset": 21},
        fallback={"name": "median", "p50": 100.0},
        created=T0)
    write_manifest(folder, manifest, hmac_key=key)
    return manifest


def _reason(folder: Path, **kw) -> str:
    kw.setdefault("now", T0 + timedelta(days=1))
    with pytest.raises(ManifestError) as info:
        verify_manifest(folder, **kw)
    assert info.value.reason in REASON_CODES
    return info.value.reason


def _edit(folder: Path, fn) -> None:
    path = folder / "manifest.json"
    m = json.loads(path.read_text())
    fn(m)
    path.write_bytes(canonical_json(m))


def test_round_trip(tmp_path):
    built = _make(tmp_path / "a")
    got = verify_manifest(tmp_path / "a", now=T0 + timedelta(days=1), required_kind="demand")
    assert got == built
    assert got["schema_version"] == MANIFEST_SCHEMA_VERSION
    assert [f["path"] for f in got["files"]] == ["empty.bin", "model.onnx", "sub/vocab.json"]
    assert got["files"][1]["size"] == 1024
    assert got["created_at"] == "2024-05-01T12:00:00Z"
    assert got["valid_until"] == "2024-05-31T12:00:00Z"
    assert got["content_hash"].startswith("sha256:")
    raw = (tmp_path / "a" / "manifest.json").read_bytes()
    assert raw == canonical_json(built) + b"\n"
    assert read_verified_file(tmp_path / "a", got, "model.onnx") == bytes(range(256)) * 4


def test_signed_round_trip_and_key_optional(tmp_path):
    _make(tmp_path, key=KEY)
    m = verify_manifest(tmp_path, hmac_key=KEY, now=T0)
    assert m["signature"].startswith("hmac-sha256:")
    verify_manifest(tmp_path, now=T0)  # without a key the signature is not checked


def test_extra_unlisted_files_are_ignored(tmp_path):
    m = _make(tmp_path)
    (tmp_path / "evil.onnx").write_bytes(b"shadow")
    assert verify_manifest(tmp_path, now=T0) == m
    assert _reason_read(tmp_path, m, "evil.onnx") == "not_listed"


def _reason_read(folder, manifest, name) -> str:
    with pytest.raises(ManifestError) as info:
        read_verified_file(folder, manifest, name)
    return info.value.reason


def test_tampered_byte(tmp_path):
    _make(tmp_path)
    data = bytearray((tmp_path / "model.onnx").read_bytes())
    data[500] ^= 0x01
    (tmp_path / "model.onnx").write_bytes(bytes(data))
    assert _reason(tmp_path) == "hash_mismatch"


def test_truncated_file(tmp_path):
    _make(tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"short")
    assert _reason(tmp_path) == "size_mismatch"


def test_renamed_file(tmp_path):
    _make(tmp_path)
    (tmp_path / "model.onnx").rename(tmp_path / "model2.onnx")
    assert _reason(tmp_path) == "missing_file"


def test_listed_path_is_directory(tmp_path):
    _make(tmp_path)
    (tmp_path / "model.onnx").unlink()
    (tmp_path / "model.onnx").mkdir()
    assert _reason(tmp_path) == "not_a_file"


@pytest.mark.parametrize("bad", ["../x", "sub/../../x", "/etc/passwd", "C:/x", "a\\..\\x",
                                 "./model.onnx", "sub//vocab.json", ""])
def test_path_escape(tmp_path, bad):
    _make(tmp_path)

    def add(m):
        m["files"].append({"path": bad, "sha256": "0" * 64, "size": 0})
        from replaylab.contracts.manifest import content_hash
        m["content_hash"] = content_hash(m)

    _edit(tmp_path, add)
    assert _reason(tmp_path) == "path_escape"


def test_symlink_escaping_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.onnx").write_bytes(bytes(range(256)) * 4)
    art = tmp_path / "art"
    _make(art)
    (art / "model.onnx").unlink()
    (art / "model.onnx").symlink_to(outside / "model.onnx")  # same bytes, outside
    assert _reason(art) == "path_escape"
    # a symlinked parent directory escaping the folder too
    (outside / "vocab.json").write_text('{"a": [1, 2, 3]}')
    (art / "model.onnx").unlink()
    (art / "model.onnx").write_bytes(bytes(range(256)) * 4)
    for p in (art / "sub").iterdir():
        p.unlink()
    (art / "sub").rmdir()
    (art / "sub").symlink_to(outside)
    assert _reason(art) == "path_escape"


def test_build_refuses_symlinks(tmp_path):
    _make(tmp_path / "a")
    (tmp_path / "a" / "link").symlink_to(tmp_path / "a" / "model.onnx")
    with pytest.raises(ValueError, match="symlink"):
        build_manifest(tmp_path / "a", kind="demand", version="1.0.0", contracts={},
                       valid_days=1, features=[], outputs={}, calibration={}, training={},
                       runtime={}, fallback={})


def test_wrong_key(tmp_path):
    _make(tmp_path, key=KEY)
    assert _reason(tmp_path, hmac_key=b"other-key") == "bad_signature"


def test_missing_signature_with_key(tmp_path):
    _make(tmp_path)
    assert _reason(tmp_path, hmac_key=KEY) == "missing_signature"


def test_expired(tmp_path):
    _make(tmp_path, valid_days=2)
    verify_manifest(tmp_path, now=T0 + timedelta(days=2))  # inclusive bound
    assert _reason(tmp_path, now=T0 + timedelta(days=2, seconds=1)) == "expired"


def test_future_created(tmp_path):
    _make(tmp_path)
    verify_manifest(tmp_path, now=T0 - timedelta(minutes=4))  # within skew
    assert _reason(tmp_path, now=T0 - timedelta(minutes=6)) == "future_created"


def test_schema_version_2(tmp_path):
    _make(tmp_path)
    _edit(tmp_path, lambda m: m.__setitem__("schema_version", "2"))
    assert _reason(tmp_path) == "schema_version"
    _edit(tmp_path, lambda m: m.pop("schema_version"))
    assert _reason(tmp_path) == "schema_version"


def test_wrong_kind(tmp_path):
    _make(tmp_path, kind="demand")
    assert _reason(tmp_path, required_kind="autoscaling") == "kind"


def test_edited_field_breaks_content_hash(tmp_path):
    _make(tmp_path)
    _edit(tmp_path, lambda m: m["calibration"]["groups"].__setitem__("code", 0.0))
    assert _reason(tmp_path) == "content_hash"


def test_edited_field_breaks_signature(tmp_path):
    _make(tmp_path, key=KEY)
    _edit(tmp_path, lambda m: m.__setitem__("valid_until", "2099-01-01T00:00:00Z"))
    assert _reason(tmp_path, hmac_key=KEY) == "bad_signature"
    _make(tmp_path, key=KEY)
    _edit(tmp_path, lambda m: m["features"][0].__setitem__("dtype", "int64"))
    assert _reason(tmp_path, hmac_key=KEY) == "bad_signature"


def test_unreadable_invalid_malformed(tmp_path):
    assert _reason(tmp_path) == "unreadable"
    (tmp_path / "manifest.json").write_text("{not json")
    assert _reason(tmp_path) == "invalid_json"
    (tmp_path / "manifest.json").write_text("[1]")
    assert _reason(tmp_path) == "invalid_json"
    (tmp_path / "manifest.json").write_text('{"schema_version": "1", "x": NaN}')
    assert _reason(tmp_path) == "invalid_json"
    _make(tmp_path)
    _edit(tmp_path, lambda m: m.pop("features"))
    assert _reason(tmp_path) == "malformed"
    _make(tmp_path)
    _edit(tmp_path, lambda m: m["files"][0].__setitem__("size", "1"))
    assert _reason(tmp_path) == "malformed"


def test_naive_datetimes_refused(tmp_path):
    _make(tmp_path)
    with pytest.raises(ValueError):
        verify_manifest(tmp_path, now=datetime(2024, 5, 2))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_single_byte_flip_is_detected(data):
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        manifest = _make(folder)
        listed = [f for f in manifest["files"] if f["size"] > 0]
        entry = data.draw(st.sampled_from(listed))
        pos = data.draw(st.integers(0, entry["size"] - 1))
        mask = data.draw(st.integers(1, 255))
        path = folder / entry["path"]
        buf = bytearray(path.read_bytes())
        buf[pos] ^= mask
        path.write_bytes(bytes(buf))
        with pytest.raises(ManifestError) as info:
            verify_manifest(folder, now=T0)
        assert info.value.reason == "hash_mismatch"
        with pytest.raises(ManifestError):
            read_verified_file(folder, manifest, entry["path"])


@pytest.fixture(params=[0o022, 0o027], ids=["umask022", "umask027"])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_written_artifacts_follow_the_umask(tmp_path, umask):
    """manifest.json and the published folder get 0666 / 0777 less the umask (0644 / 0755
    under 022), not mkstemp's 0600 / mkdtemp's 0700: a serving user who is not the
    deploying one (same group under 027) can read them."""
    out = tmp_path / "art"
    for round_ in range(2):  # a first publish, then one over the existing folder
        with staged_folder(out) as tmp:
            assert _mode(tmp) == 0o777 & ~umask
            _make(tmp)
        assert _mode(out) == 0o777 & ~umask
        assert _mode(out / "manifest.json") == 0o666 & ~umask
        assert _mode(out / "sub") == 0o777 & ~umask
        verify_manifest(out, now=T0 + timedelta(days=1))
        # the publish stays atomic: only the artifact is left, no temporary files or folders
        assert sorted(p.name for p in tmp_path.iterdir()) == ["art"], round_
        assert sorted(p.name for p in out.iterdir()) == ["empty.bin", "manifest.json",
                                                         "model.onnx", "sub"]


def test_rewritten_manifest_follows_the_umask(tmp_path, umask):
    folder = tmp_path / "a"
    manifest = _make(folder)
    os.chmod(folder / "manifest.json", 0o600)
    write_manifest(folder, manifest, hmac_key=KEY)  # replaced by a new file: umask mode
    assert _mode(folder / "manifest.json") == 0o666 & ~umask
    assert sorted(p.name for p in folder.iterdir()) == ["empty.bin", "manifest.json",
                                                        "model.onnx", "sub"]


def test_staged_folder_removed_on_error(tmp_path, umask):
    with pytest.raises(RuntimeError), staged_folder(tmp_path / "art") as tmp:
        _make(tmp)
        raise RuntimeError("export failed")
    assert list(tmp_path.iterdir()) == []


def test_import_isolation():
    code = ("import replaylab.contracts.manifest, sys; "
            "bad = {'pandas','lightgbm','onnx','torch','mlflow','numpy','sklearn'} & set(sys.modules); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)

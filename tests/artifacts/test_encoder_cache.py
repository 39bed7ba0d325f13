"""The encoder cache (`replaylab.artifacts.encoder_cache`): two runs sharing a cache folder
export the encoder once, the second waiting for the first and reusing its export."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from replaylab.artifacts import encoder_cache


@pytest.fixture
def fake_static_export(monkeypatch):
    """The static tier's distillation and export replaced by a 0.3 s stand-in that writes a
    marker file; the loader reads the marker (a verified export) or fails as a missing one."""
    import replaylab.artifacts.static_export as static_export
    import replaylab.router.static_encoder as static_encoder
    import replaylab.runtime.static_encoder as runtime_static

    exports: list[str] = []

    def export(model, folder, parity_texts, overwrite):
        time.sleep(0.3)  # long enough for a second caller to find no export yet
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "marker").write_text("exported")
        exports.append(threading.current_thread().name)

    def load(folder):
        if not (Path(folder) / "marker").is_file():
            raise OSError(f"{folder}: no export")
        return SimpleNamespace(golden_status="passed")

    monkeypatch.setattr(static_encoder, "distill_minilm", lambda: object())
    monkeypatch.setattr(static_export, "export_static_encoder", export)
    monkeypatch.setattr(runtime_static, "load_static_encoder", load)
    return exports


def test_two_runs_on_one_cache_export_once(fake_static_export, tmp_path):
    enc = {"tier": "static", "cache_dir": str(tmp_path / "cache")}
    got: list[Path] = []
    runs = [threading.Thread(target=lambda: got.append(
        encoder_cache.static_encoder_folder(enc, ["a prompt"])), name=f"run{i}")
        for i in range(2)]
    for t in runs:
        t.start()
    for t in runs:
        t.join(timeout=30)
    assert len(got) == 2 and got[0] == got[1] == tmp_path / "cache" / "encoder-static"
    assert len(fake_static_export) == 1, fake_static_export  # the second reused the first's
    # a later run reuses it without exporting
    encoder_cache.static_encoder_folder(enc, ["a prompt"])
    assert len(fake_static_export) == 1


def test_a_broken_export_is_made_again_under_the_lock(fake_static_export, tmp_path):
    enc = {"tier": "static", "cache_dir": str(tmp_path / "cache")}
    folder = encoder_cache.static_encoder_folder(enc, ["a prompt"])
    (folder / "marker").unlink()  # the export no longer verifies
    assert encoder_cache.static_encoder_folder(enc, ["a prompt"]) == folder
    assert len(fake_static_export) == 2 and (folder / "marker").is_file()

"""The results scripts' data folder (replaylab.apps.shared_data): named, never guessed."""

from __future__ import annotations

import pytest

from replaylab.apps.shared_data import SHARED_DATA_ENV, SharedDataMissing, shared_data_dir


def test_the_flag_wins_then_the_environment(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    monkeypatch.setenv(SHARED_DATA_ENV, str(b))
    assert shared_data_dir(a) == a.resolve() and shared_data_dir(None) == b.resolve()


def test_no_folder_named_or_not_a_folder_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(SHARED_DATA_ENV, raising=False)
    with pytest.raises(SharedDataMissing, match=f"give --shared DIR or set {SHARED_DATA_ENV}"):
        shared_data_dir(None)
    with pytest.raises(SharedDataMissing, match="--shared=.*: not a folder"):
        shared_data_dir(tmp_path / "absent")

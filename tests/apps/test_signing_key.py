"""The signing key (`replaylab.apps.provenance.hmac_key`): signed by default, no setup.

REPLAYLAB_HMAC_KEY wins when set; else the key file ($REPLAYLAB_HMAC_KEY_FILE, else one per
project under $XDG_CONFIG_HOME), created on first use with mode 0600 and its path printed
once, the same key on every later call; a variable the config names that is unset is a
ConfigError.
"""

from __future__ import annotations

import stat

import pytest

from replaylab.apps.provenance import hmac_key, key_file_path
from replaylab.config import ConfigError


def test_the_key_file_is_created_once_private_and_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("REPLAYLAB_HMAC_KEY", raising=False)
    path = tmp_path / "keys" / "signing.key"
    monkeypatch.setenv("REPLAYLAB_HMAC_KEY_FILE", str(path))
    first = hmac_key()
    assert path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) == 64 and first == path.read_text().strip().encode()
    assert capsys.readouterr().err.count(f"signing key: created {path}") == 1
    assert hmac_key() == first and hmac_key(None) == first  # reused, printed once
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("REPLAYLAB_HMAC_KEY", "team-key")
    assert hmac_key() == b"team-key"  # the team's or CI's key wins


def test_the_default_key_file_is_per_project_outside_the_repository(tmp_path, monkeypatch):
    monkeypatch.delenv("REPLAYLAB_HMAC_KEY_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "a" / "proj").mkdir(parents=True)
    (tmp_path / "b" / "proj").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "proj")
    one = key_file_path()
    monkeypatch.chdir(tmp_path / "b" / "proj")
    other = key_file_path()
    assert one.parent == other.parent == tmp_path / "config" / "replaylab" / "keys"
    assert one != other and one.name.startswith("proj-")  # same folder name, other project


def test_a_named_variable_that_is_unset_is_refused(monkeypatch):
    monkeypatch.delenv("MY_TEAM_KEY", raising=False)
    with pytest.raises(ConfigError, match="MY_TEAM_KEY"):
        hmac_key("MY_TEAM_KEY")

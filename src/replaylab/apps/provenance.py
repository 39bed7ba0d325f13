"""Provenance the library must not look up itself: the git commit of the working
tree and the signing key (an environment variable, or a key file created on first use)."""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
from pathlib import Path

from replaylab.config import ConfigError


def git_commit() -> str | None:
    """HEAD of the working tree (`-dirty` when it has changes), None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head


DEFAULT_KEY_ENV = "REPLAYLAB_HMAC_KEY"  # a team's or CI's key (export.hmac_key_env's default)
KEY_FILE_ENV = "REPLAYLAB_HMAC_KEY_FILE"  # a key file instead (CI, tests: a temporary path)


def key_file_path() -> Path:
    """The signing key file: $REPLAYLAB_HMAC_KEY_FILE, else one per project outside the
    repository, `$XDG_CONFIG_HOME/replaylab/keys/<folder>-<12 hex of its path>.key`
    (~/.config when unset), the project being the folder the entry point runs in."""
    if os.environ.get(KEY_FILE_ENV):
        return Path(os.environ[KEY_FILE_ENV]).expanduser()
    project = Path.cwd().resolve()
    home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    tag = hashlib.sha256(str(project).encode("utf-8")).hexdigest()[:12]
    return home / "replaylab" / "keys" / f"{project.name}-{tag}.key"


def _key_from_file(path: Path) -> bytes:
    """The key in `path`, created on first use (32 random bytes as hex, mode 0600, O_EXCL so
    two runs starting together end with one key); its path is printed when created."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as e:
        raise ConfigError(f"signing key file {path}: cannot create it ({e}); set "
                          f"{DEFAULT_KEY_ENV} or {KEY_FILE_ENV}") from None
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        print(f"signing key: created {path} (this project's key, outside the repository; "
              f"teams and CI set {DEFAULT_KEY_ENV} or {KEY_FILE_ENV})", file=sys.stderr)
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"signing key file {path}: cannot read it ({e})") from None
    if not value:
        raise ConfigError(f"signing key file {path} is empty: delete it (a new key is "
                          f"created) or set {DEFAULT_KEY_ENV}")
    return value.encode("utf-8")


def hmac_key(env_name: str | None = DEFAULT_KEY_ENV) -> bytes:
    """The signing key: manifests are signed by default (docs/specs/artifacts.md).

    From environment variable `env_name` (`export.hmac_key_env`, default
    REPLAYLAB_HMAC_KEY) when it is set; else from the key file (`key_file_path`:
    $REPLAYLAB_HMAC_KEY_FILE or the project's own, created on first use). A variable
    named in the config other than the default that is unset is a ConfigError (the
    config asked for that key)."""
    if env_name:
        value = os.environ.get(str(env_name))
        if value:
            return value.encode("utf-8")
        if str(env_name) != DEFAULT_KEY_ENV:
            raise ConfigError(f"export.hmac_key_env={env_name!r}: that environment variable "
                              "is unset")
    return _key_from_file(key_file_path())

"""Provenance the library must not look up itself: the git commit of the working
tree and the signing key named by the config (an environment variable)."""

from __future__ import annotations

import os
import subprocess

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


def hmac_key(env_name: str | None) -> bytes | None:
    """The signing key from environment variable `env_name` (None: unsigned)."""
    if not env_name:
        return None
    value = os.environ.get(str(env_name))
    if not value:
        raise ConfigError(f"export.hmac_key_env={env_name!r}: that environment variable is unset")
    return value.encode("utf-8")

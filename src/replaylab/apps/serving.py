"""The native library for serving, located from the environment (the runtime reads none).

`REPLAYLAB_NATIVE_LIB`, when set, names `libreplaylab_scorer.so` (an error when it is not
there: a host that asks for the native path must get it); unset, the crate's build in a
checkout or a copy inside the package (`replaylab.runtime.native.search_path()`), else None:
the pure Python runtime serves.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from replaylab.runtime.native import NativeError, NativeLibrary

ENV_NATIVE_LIB = "REPLAYLAB_NATIVE_LIB"


def native_library(env: Mapping[str, str] | None = None) -> NativeLibrary | None:
    """The loaded native library, or None when it is not built (and not asked for)."""
    env = os.environ if env is None else env
    path = env.get(ENV_NATIVE_LIB)
    if path:
        if NativeLibrary.find(path) is None:
            raise NativeError(f"{ENV_NATIVE_LIB}={path} is not a file")
        return NativeLibrary.load(path)
    found = NativeLibrary.find()
    return None if found is None else NativeLibrary.load(found)

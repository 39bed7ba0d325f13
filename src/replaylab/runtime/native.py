"""Serving through the native library (`libreplaylab_scorer.so`, scorers/rust; its C ABI is
docs/specs/c-abi.md) from Python threads.

ctypes calls a `CDLL` function with the GIL released, so threads that share one loaded
handle score on every core: the Python runtime's own path holds the GIL for its numpy
work, and 2 threads served less than 1 (issue 47). Handwritten over ctypes (standard
library) rather than cffi: nine functions, no build step, nothing more to install.

    from replaylab.runtime.native import NativeLibrary, NativeRouter
    lib = NativeLibrary.load()             # the crate's build, or a path given
    router = NativeRouter.load(lib, "artifacts/router")
    router.route_json('{"text": "...", "category": null, "prompt_tokens": null}')

The answers are the JSON lines of `replaylab-route` (hint, decision, ledger-v1 receipt),
as `str`; the `predict` / `route` / `bind` conveniences parse them. Loading verifies as
the Rust loaders do (manifests, hashes, validity, golden vectors) and raises
`NativeError` (an `InputError`) with the library's reason. Without the library the pure
Python runtime (`DemandPredictor`, `Router`, `SessionBinder`) serves: `NativeLibrary.find`
returns None and nothing here is imported by them.

Locating the library (no environment read here; `replaylab.apps.serving` reads
REPLAYLAB_NATIVE_LIB and passes it): a path given, else the crate's release build beside
the package in a checkout (`scorers/rust/target/release`, what `make setup` builds when
cargo is present), else `replaylab/_native/` inside an installed package.
"""

from __future__ import annotations

import ctypes
import json
import math
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from replaylab.contracts.errors import InputError

LIBRARY_NAME = "libreplaylab_scorer.so"


def search_path() -> tuple[Path, ...]:
    """Where the library is looked for: the crate's release build beside the package in a
    checkout, then `replaylab/_native/` inside the package."""
    package = Path(__file__).resolve().parents[1]  # src/replaylab
    return (package.parents[1] / "scorers" / "rust" / "target" / "release" / LIBRARY_NAME,
            package / "_native" / LIBRARY_NAME)

# return codes (include/replaylab.h)
RL_ERR_NULL, RL_ERR_INPUT, RL_ERR_PANIC, RL_ERR_TOO_LARGE, RL_ERR_UNSUPPORTED, RL_ERR_STATE = \
    -1, -2, -3, -4, -5, -6

_C = ctypes
_OUT = (_C.c_char_p, _C.c_size_t)
# name -> (restype, argtypes)
SIGNATURES: dict[str, tuple[Any, tuple]] = {
    "rl_last_error": (_C.c_char_p, ()),
    "rl_demand_load": (_C.c_void_p, (_C.c_char_p, _C.c_double)),
    "rl_demand_hint_json": (_C.c_int, (_C.c_void_p, _C.c_char_p, *_OUT)),
    "rl_demand_hint_json_at": (_C.c_int, (_C.c_void_p, _C.c_char_p, _C.c_int64, *_OUT)),
    "rl_demand_free": (None, (_C.c_void_p,)),
    "rl_router_load": (_C.c_void_p, (_C.c_char_p, _C.c_double)),
    "rl_router_route_json": (_C.c_int, (_C.c_void_p, _C.c_char_p, *_OUT)),
    "rl_router_route_embedding": (_C.c_int, (_C.c_void_p, _C.POINTER(_C.c_float), _C.c_size_t,
                                             _C.c_char_p, _C.c_double, *_OUT)),
    "rl_router_golden_texts_json": (_C.c_int, (_C.c_void_p, *_OUT)),
    "rl_router_verify_encoder": (_C.c_int, (_C.c_void_p, _C.POINTER(_C.c_float), _C.c_size_t,
                                            _C.c_size_t, *_OUT)),
    "rl_router_free": (None, (_C.c_void_p,)),
    "rl_binder_new": (_C.c_void_p, (_C.c_void_p, _C.c_char_p)),
    "rl_binder_bind_json": (_C.c_int, (_C.c_void_p, _C.c_char_p, *_OUT)),
    "rl_binder_report_failure": (_C.c_int, (_C.c_void_p, _C.c_char_p)),
    "rl_binder_stats_json": (_C.c_int, (_C.c_void_p, *_OUT)),
    "rl_binder_free": (None, (_C.c_void_p,)),
}


class NativeError(InputError, RuntimeError):
    """The native library is absent, or refused an artifact or a call (its reason)."""


def _bytes(text: str | bytes) -> bytes:
    return text if text.__class__ is bytes else text.encode("utf-8")


class NativeLibrary:
    """The loaded library with its C signatures, and one answer buffer per thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # CDLL (not PyDLL): every call releases the GIL
        self.cdll = ctypes.CDLL(str(path))
        for name, (res, args) in SIGNATURES.items():
            fn = getattr(self.cdll, name)
            fn.restype, fn.argtypes = res, list(args)
        self._local = threading.local()

    @staticmethod
    def find(path: str | Path | None = None) -> Path | None:
        """The library file: `path` when given (None if it is not a file), else the first of
        `search_path()` that exists, else None."""
        if path is not None:
            return Path(path) if Path(path).is_file() else None
        return next((p for p in search_path() if p.is_file()), None)

    @classmethod
    def load(cls, path: str | Path | None = None) -> NativeLibrary:
        found = cls.find(path)
        if found is None:
            where = path or " or ".join(str(p) for p in search_path())
            raise NativeError(f"native library not found at {where} (build it: cd scorers/rust "
                              "&& cargo build --release)")
        return cls(found)

    def last_error(self) -> str:
        msg = self.cdll.rl_last_error()
        return msg.decode("utf-8", "replace") if msg else "(no message)"

    def answer(self, fn: Any, *args: Any) -> str:
        """Call `fn(*args, out, cap)` with this thread's buffer, grown once when too small.
        (The hot path of every call, under the GIL: kept to a few attribute reads.)"""
        try:
            buf = self._local.buf
        except AttributeError:
            buf = self._local.buf = ctypes.create_string_buffer(4096)
        rc = fn(*args, buf, len(buf))
        if rc > 0:  # too small: rc is the size needed
            buf = self._local.buf = ctypes.create_string_buffer(rc)
            rc = fn(*args, buf, rc)
        if rc != 0:
            raise NativeError(f"{fn.__name__} answered {rc}: {self.last_error()}")
        return buf.value.decode("utf-8")

    def handle(self, fn: Any, *args: Any) -> int:
        h = fn(*args)
        if not h:
            raise NativeError(f"{fn.__name__}: {self.last_error()}")
        return h


class _Handle:
    """A library handle freed with its owner (explicitly by `close`, or when collected)."""

    _free = ""

    def __init__(self, lib: NativeLibrary, handle: int) -> None:
        self.lib, self.handle = lib, handle
        self._answer, self._cdll = lib.answer, lib.cdll

    def close(self) -> None:
        if self.handle:
            getattr(self.lib.cdll, self._free)(self.handle)
            self.handle = 0

    def __del__(self) -> None:
        self.close()


class NativeDemandPredictor(_Handle):
    """A demand artifact served natively: `hint_json` answers `replaylab-route demand`'s
    line for the dict `DemandPredictor.predict` takes."""

    _free = "rl_demand_free"

    @classmethod
    def load(cls, lib: NativeLibrary, path: str | Path, *, now_s: float = 0.0) -> NativeDemandPredictor:
        """Verify and load (validity at `now_s`, 0: now; golden vectors checked)."""
        return cls(lib, lib.handle(lib.cdll.rl_demand_load, _bytes(str(path)), now_s))

    def hint_json(self, request_json: str | bytes, now_ms: int | None = None) -> str:
        """The hint line; `now_ms` stamps a request without `timestamp` (None: now)."""
        if now_ms is None:
            return self._answer(self._cdll.rl_demand_hint_json, self.handle, _bytes(request_json))
        return self._answer(self._cdll.rl_demand_hint_json_at, self.handle, _bytes(request_json),
                            int(now_ms))

    def predict(self, request: Mapping[str, Any], now_ms: int | None = None) -> dict[str, Any]:
        return json.loads(self.hint_json(json.dumps(request), now_ms))


class NativeRouter(_Handle):
    """A router artifact served natively: the static tier from text, either tier from the
    host's embedding (`route_embedding`)."""

    _free = "rl_router_free"

    @classmethod
    def load(cls, lib: NativeLibrary, path: str | Path, *, now_s: float = 0.0) -> NativeRouter:
        return cls(lib, lib.handle(lib.cdll.rl_router_load, _bytes(str(path)), now_s))

    def route_json(self, request_json: str | bytes) -> str:
        """`{"text", "category", "prompt_tokens"}` -> `replaylab-route route`'s line."""
        return self._answer(self._cdll.rl_router_route_json, self.handle, _bytes(request_json))

    def route(self, text: str, category: str | None = None,
              prompt_tokens: float | None = None) -> dict[str, Any]:
        return json.loads(self.route_json(json.dumps(
            {"text": text, "category": category, "prompt_tokens": prompt_tokens})))

    def route_embedding(self, embedding: Sequence[float], category: str | None = None,
                        prompt_tokens: float | None = None) -> dict[str, Any]:
        """The head on the host's own embedding (float32 values); prompt_tokens None: unknown."""
        arr = (ctypes.c_float * len(embedding))(*embedding)
        tokens = math.nan if prompt_tokens is None else float(prompt_tokens)
        return json.loads(self.lib.answer(
            self.lib.cdll.rl_router_route_embedding, self.handle, arr, len(embedding),
            None if category is None else _bytes(category), tokens))


    def golden_texts(self) -> list[dict[str, Any]]:
        """The golden texts whose embeddings prove a host's encoder (MiniLM tier)."""
        return json.loads(self._answer(self._cdll.rl_router_golden_texts_json, self.handle))

    def verify_encoder(self, embeddings: Sequence[Sequence[float]]) -> dict[str, Any]:
        """Check the host's embeddings of `golden_texts()` (one row each): the summary;
        `NativeError` (code RL_ERR_DRIFT = -7) when the encoder drifted."""
        rows = [list(r) for r in embeddings]
        dim = len(rows[0]) if rows else 0
        flat = (ctypes.c_float * (len(rows) * dim))(*[x for r in rows for x in r])
        return json.loads(self._answer(self._cdll.rl_router_verify_encoder, self.handle, flat,
                                       len(rows), dim))


class NativeSessionBinder(_Handle):
    """`SessionBinder` served natively: one locked binder, callable from many threads.
    Keyword arguments: SessionBinder's (rate, cap, salt, ladder, ttl_s, max_sessions,
    fallback_candidate); `router` None: every opening takes `fallback_candidate`."""

    _free = "rl_binder_free"

    def __init__(self, lib: NativeLibrary, router: NativeRouter | None, **config: Any) -> None:
        self.router = router  # held: the library keeps its own reference too
        super().__init__(lib, lib.handle(lib.cdll.rl_binder_new,
                                         router.handle if router is not None else None,
                                         _bytes(json.dumps(config))))

    def bind_json(self, turn_json: str | bytes) -> str:
        """`{"session_id", "text", "category", "prompt_tokens", "turn_index", "now"}` -> the
        receipt (the binder's canonical record, `replaylab-route bind`'s line)."""
        return self._answer(self._cdll.rl_binder_bind_json, self.handle, _bytes(turn_json))

    def bind(self, session_id: str, text: str = "", *, category: str | None = None,
             prompt_tokens: float | None = None, turn_index: int | None = None,
             now: float | None = None) -> dict[str, Any]:
        turn = {"session_id": session_id, "text": text, "category": category,
                "prompt_tokens": prompt_tokens, "turn_index": turn_index}
        if now is not None:
            turn["now"] = now
        return json.loads(self.bind_json(json.dumps(turn)))

    def report_failure(self, session_id: str) -> bool:
        rc = self.lib.cdll.rl_binder_report_failure(self.handle, _bytes(session_id))
        if rc < 0:
            raise NativeError(f"rl_binder_report_failure answered {rc}: {self.lib.last_error()}")
        return rc == 1

    def stats_json(self) -> str:
        return self.lib.answer(self.lib.cdll.rl_binder_stats_json, self.handle)

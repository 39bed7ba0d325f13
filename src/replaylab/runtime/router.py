"""Router: route a query to the cheapest candidate likely to succeed (numpy, onnxruntime, tokenizers).

`Router.load(path)` verifies the router artifact (`replaylab.router.artifact`:
manifest kind `router`, every file's size and sha256, validity, optional HMAC),
then the encoder's own manifest and that its content hash is the one the
router was trained with, then loads the head and `router.json`. It never
raises for a bad artifact: an untrusted or missing artifact routes every query
to the caller's fallback candidate, which the caller must name (there are no
candidates without an artifact), with `fallback=True` and the reason.

`route(text, category=None, prompt_tokens=None)`: embed the text, score every
candidate (P(success)), pick the cheapest whose score clears the threshold
(`router.json` `rule`: "margin", success minus the best other candidate's
success >= threshold; "absolute", success >= threshold), else the strongest
(`fallback_candidate`, the best on the calibration split;
`replaylab.router.policy` is the same rule in training). When the loaded model
fails on one query (e.g. a text the tokenizer rejects), that query is routed by
the artifact's scenario rules (task -> candidate, long prompts), also marked
`fallback`. The router decides a
logical model only; pools, capacity and admission are decided below it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.artifacts.manifest import ManifestError, read_verified_file, verify_manifest

KIND = "router"
HEAD_FILE = "head.onnx"
CONFIG_FILE = "router.json"
ENCODER_DIR = "encoder"


@dataclass(frozen=True)
class RouteDecision:
    """One routing answer; `scores` maps candidate -> P(success) (empty on fallback)."""

    candidate: str
    scores: dict[str, float] = field(default_factory=dict)
    threshold: float | None = None
    version: str | None = None
    fallback: bool = False
    reason: str | None = None
    decision: str = "learned"  # learned | rules:<which> | fallback


class Router:
    """A verified router artifact, or the fallback with its reason (`loaded`, `reason`)."""

    def __init__(self, *, fallback_candidate: str | None, reason: str | None = None) -> None:
        self.reason = reason
        self.fallback_candidate = fallback_candidate
        self.version: str | None = None
        self.candidates: tuple[str, ...] = ()
        self.threshold: float | None = None
        self.rule = "absolute"
        self._top = -1
        self.manifest: dict | None = None
        self._encoder = None
        self._head = None
        self._config: dict = {}
        self._vocab: dict[str, int] = {}

    @property
    def loaded(self) -> bool:
        return self._head is not None

    @classmethod
    def load(cls, path: str | Path | None, *, fallback_candidate: str | None = None,
             hmac_key: bytes | None = None, threads: int = 1, variant: str = "fp32",
             clock: Callable[[], float] = time.time) -> Router:
        """Verify and load; never raises for a bad or missing artifact (see the module doc)."""
        r = cls(fallback_candidate=fallback_candidate)
        if path is None or not Path(path).is_dir():
            r.reason = "missing_artifact"
            return r
        folder = Path(path)
        try:
            from replaylab.runtime.encoder import load_encoder

            now = datetime.fromtimestamp(clock(), UTC)
            m = verify_manifest(folder, hmac_key=hmac_key, now=now, required_kind=KIND)
            enc = load_encoder(folder / ENCODER_DIR, variant=variant, threads=threads, now=now)
            enc_manifest = json.loads(read_verified_file(folder, m, f"{ENCODER_DIR}/manifest.json"))
            want = m["features"][0].get("encoder_content_hash")
            if enc_manifest.get("content_hash") != want:
                raise ManifestError("encoder_mismatch", "the encoder is not the one the head "
                                                        "was trained with")
            config = json.loads(read_verified_file(folder, m, CONFIG_FILE))
            head = _session(read_verified_file(folder, m, HEAD_FILE), threads)
        except ManifestError as exc:
            r.reason = exc.reason
            return r
        except Exception:  # noqa: BLE001 - a graph or file onnxruntime refuses: fall back
            r.reason = "onnx_load"
            return r
        r.manifest, r._encoder, r._head, r._config = m, enc, head, config
        r.candidates = tuple(config["candidates"])
        r.threshold = float(config["threshold"])
        r.rule = str(config.get("rule", "absolute"))
        top = config.get("fallback_candidate", r.candidates[-1])
        if r.rule not in ("absolute", "margin") or top not in r.candidates:
            r._head = None
            r.reason = "bad_config"
            r.fallback_candidate = r.fallback_candidate or r.candidates[-1]
            return r
        r._top = r.candidates.index(top)
        r._vocab = {v: i for i, v in enumerate(config["category_vocabulary"])}
        r.version = f"{m['version']}+{m['content_hash'].removeprefix('sha256:')[:12]}"
        if r.fallback_candidate is None:
            r.fallback_candidate = top
        return r

    # ------------------------------------------------------------------ routing
    def route(self, text: str, category: str | None = None,
              prompt_tokens: float | None = None) -> RouteDecision:
        """Route one query (see the module docstring)."""
        return self.route_batch([text], [category], [prompt_tokens])[0]

    def route_batch(self, texts: Sequence[str], categories: Sequence[str | None] | None = None,
                    prompt_tokens: Sequence[float | None] | None = None) -> list[RouteDecision]:
        n = len(texts)
        categories = list(categories) if categories is not None else [None] * n
        tokens = list(prompt_tokens) if prompt_tokens is not None else [None] * n
        if not self.loaded:
            cand = self.fallback_candidate
            if cand is None:
                raise ValueError("no artifact and no fallback_candidate: pass "
                                 "Router.load(..., fallback_candidate=<strongest>)")
            return [RouteDecision(cand, fallback=True, reason=self.reason, decision="fallback")
                    for _ in range(n)]
        try:
            prob = self._scores(texts, categories, tokens)
        except Exception:  # noqa: BLE001 - the model failed on this input: the rules answer
            return [self._by_rules(t, c, p) for t, c, p in zip(texts, categories, tokens,
                                                                strict=True)]
        out = []
        for i in range(n):
            row = prob[i]
            q = row
            # policy.routing_scores, written again for one row: the runtime stays off the
            # training package (pandas) and this is three lines
            if self.rule == "margin" and len(row) > 1:  # minus the best OTHER candidate's
                top2 = np.sort(row)[-2:]
                q = row - np.where(row >= top2[1], top2[0], top2[1])
            passing = np.flatnonzero(q >= self.threshold)
            k = int(passing[0]) if len(passing) else self._top
            out.append(RouteDecision(self.candidates[k],
                                     {c: float(v) for c, v in zip(self.candidates, row,
                                                                   strict=True)},
                                     self.threshold, self.version))
        return out

    def _scores(self, texts: Sequence[str], categories: list, tokens: list) -> np.ndarray:
        emb = self._encoder.encode(list(texts))
        other = len(self._vocab)
        cat = np.array([self._vocab.get(str(c), other) if c is not None else other
                        for c in categories], dtype=np.int64)
        cpt = float(self._config["prompt_tokens"]["chars_per_token"])
        pt = np.array([float(p) if p is not None else math.ceil(len(t) / cpt)
                       for t, p in zip(texts, tokens, strict=True)], dtype=np.float32)
        return self._head.run(["success_prob"], {"embedding": emb.astype(np.float32),
                                                 "category": cat, "prompt_tokens": pt})[0]

    def _by_rules(self, text: str, category: str | None, tokens: float | None) -> RouteDecision:
        rules = self._config["rules"]
        cpt = float(self._config["prompt_tokens"]["chars_per_token"])
        length = float(tokens) if tokens is not None else math.ceil(len(text or "") / cpt)
        if rules.get("long_prompt_tokens") is not None and length > rules["long_prompt_tokens"]:
            cand, why = rules["long_prompt_candidate"], "rules:long_prompt"
        elif category is not None and str(category) in rules["task_candidate"]:
            cand, why = rules["task_candidate"][str(category)], f"rules:task:{category}"
        else:
            cand, why = rules["default_candidate"], "rules:default"
        return RouteDecision(cand, version=self.version, fallback=True, reason="model_error",
                             decision=why)


def _session(model: bytes, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])

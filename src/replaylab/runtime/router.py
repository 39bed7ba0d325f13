"""Router: route a query to the cheapest candidate likely to succeed (numpy, onnxruntime, tokenizers).

Two encoder tiers (`router.json` `encoder.tier`): `minilm`, the ONNX
transformer (`replaylab.runtime.encoder`), and `static`, its model2vec
distillation (`replaylab.runtime.static_encoder`: table tokenizer, lookup, mean;
tens of microseconds). The head and the decision are the same for both.

`Router.load(path)` verifies the router artifact (`replaylab.artifacts.router_export`:
manifest kind `router`, every file's size and sha256, validity, optional HMAC),
then the encoder's own manifest and that its content hash is the one the
router was trained with, then loads the head and `router.json`. It never
raises for a bad artifact: an untrusted or missing artifact routes every query
to the caller's fallback candidate, which the caller must name (there are no
candidates without an artifact), with `fallback=True` and the reason.

With `check_golden` (the default) the artifact's golden vectors (encoder and
router, `replaylab.contracts.golden`) are re-checked on this machine: int8 that
misses them serves fp32, fp32 that misses them falls back (`golden_mismatch`);
`load_report()` says which variant serves and why.

`route(text, category=None, prompt_tokens=None)`: embed the text, score every
candidate (P(success)), pick the cheapest whose score clears the threshold
(`router.json` `rule`: "margin", success minus the best other candidate's
success >= threshold; "absolute", success >= threshold), else the strongest
(`fallback_candidate`, the best on the calibration split;
`replaylab.runtime.routing`, the one implementation training uses too). When the loaded model
fails on one query (e.g. a text the tokenizer rejects), that query is routed by
the artifact's scenario rules (task -> candidate, long prompts), also marked
`fallback`. The router decides a
logical model only; pools, capacity and admission are decided below it.

`route_embedding(embedding, category=None, prompt_tokens=None)`: the same decision on
an embedding the host computed (a host that already runs all-MiniLM-L6-v2); given the
runtime's own embedding of a text and the prompt tokens `route` used, the decision's
scores are `route`'s, bit for bit. A MiniLM-tier artifact's golden.json carries
(text, fp32 embedding, decision) triples; `check_host_encoder(embed)` checks a host's
encoder on them (docs/specs/router-scorer.md, "Routing on the host's embedding":
every cosine >= `host_min_cosine`, every |difference| <= `host_max_abs`, every stable
decision equal), and `Router.load(..., host_encoder=embed)` does it at load: a host
whose encoder drifts gets an unloaded router, reason `encoder_drift`, and one WARNING
that says what drifted.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.contracts.golden import (
    MISMATCH,
    GoldenCheck,
    GoldenError,
    Timer,
    check,
    max_abs_diff,
    read_golden,
    row_cosines,
    stable_agreement,
)
from replaylab.contracts.manifest import ManifestError, read_verified_file, verify_manifest
from replaylab.runtime.router_head import HEAD_TENSORS_FILE, HeadScorer
from replaylab.runtime.routing import RULES, choose_by_threshold, choose_one

# One WARNING per load that falls back (reason code and path), nothing on a good load.
log = logging.getLogger(__name__)

KIND = "router"
HEAD_FILE = "head.onnx"
CONFIG_FILE = "router.json"
ENCODER_DIR = "encoder"
ENCODER_DRIFT = "encoder_drift"  # the reason code of a host encoder that misses the triples
# the golden variant whose embeddings the triples hold (the MiniLM tier's fp32 encoder)
TRIPLE_VARIANT = "fp32"


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
    variant: str | None = None  # the encoder variant that embedded the query
    # the query's (d,) float32 embedding, only when `route(..., keep_embedding=True)`
    embedding: np.ndarray | None = field(default=None, compare=False, repr=False)


class Router:
    """A verified router artifact, or the fallback with its reason (`loaded`, `reason`)."""

    def __init__(self, *, fallback_candidate: str | None, reason: str | None = None) -> None:
        self.reason = reason
        self.fallback_candidate = fallback_candidate
        self.version: str | None = None
        self.candidates: tuple[str, ...] = ()
        self.threshold: float | None = None
        self.rule = "absolute"
        self._fallback = -1
        self.manifest: dict | None = None
        self._encoder = None
        self._head = None
        self._config: dict = {}
        self._folder: Path | None = None
        self._static = False  # the head is numpy's forward pass: `route` takes the one-row path
        self._chars_per_token = 4.0
        self.golden: GoldenCheck | None = None
        self.golden_status = "unchecked"  # passed | absent | unchecked
        self.requested_variant: str | None = None
        self.variant_reason: str | None = None
        self.host_encoder_check: GoldenCheck | None = None  # Router.load(..., host_encoder=)

    @property
    def loaded(self) -> bool:
        return self._head is not None

    @property
    def head(self) -> HeadScorer | None:
        """The loaded head (`HeadScorer`: kind `onnx`, its ONNX session, or for the static
        tier kind `numpy`, its forward pass; and its vocabulary); None when not loaded."""
        return self._head

    @property
    def fallback(self) -> int:
        """The fallback column: `fallback_candidate`'s among `candidates` (the strongest on
        calibration; the one name of that column in training and serving, `fallback`)."""
        return self._fallback

    @property
    def encoder(self) -> Any:
        """The loaded encoder (MiniLM ONNX or static); None when not loaded."""
        return self._encoder

    @property
    def tier(self) -> str | None:
        """`minilm` or `static`: which encoder the artifact ships; None when not loaded."""
        if self._encoder is None:
            return None
        return getattr(self._encoder, "tier", "minilm")

    @property
    def variant(self) -> str | None:
        """The encoder variant that serves (fp32 when int8 was asked for but missed its
        golden vectors here); None when not loaded."""
        return None if self._encoder is None else self._encoder.variant

    def load_report(self) -> dict:
        """What serving should log once after `load`: variant, golden checks, reasons."""
        enc = self._encoder
        return {"loaded": self.loaded, "reason": self.reason, "version": self.version,
                "tier": self.tier, "variant": self.variant, "requested_variant": self.requested_variant,
                "variant_reason": self.variant_reason, "golden_status": self.golden_status,
                "golden": None if self.golden is None else self.golden.as_dict(),
                "encoder_golden": (None if enc is None or enc.golden is None
                                   else enc.golden.as_dict())}

    @classmethod
    def load(cls, path: str | Path | None, *, fallback_candidate: str | None = None,
             hmac_key: bytes | None = None, threads: int = 1, variant: str = "fp32",
             clock: Callable[[], float] = time.time, check_golden: bool = True,
             host_encoder: Callable[[str], Any] | None = None) -> Router:
        """Verify and load; never raises for a bad or missing artifact (see the module doc).

        `host_encoder`: the host's own encoder (text -> (d,) embedding), for a host that
        routes with `route_embedding`: it is checked on the artifact's golden triples
        (`check_host_encoder`); one that misses them leaves the router unloaded with reason
        `encoder_drift` (the figures in `host_encoder_check`).

        With `check_golden` (the default) the encoder's and the router's golden vectors
        are re-checked on this machine (`check_golden_vectors`): a variant other than
        fp32 that misses them is replaced by fp32 (`variant_reason` says so); an fp32
        miss leaves the router unloaded with reason `golden_mismatch`, and the caller's
        fallback candidate answers. An artifact without golden vectors loads with
        `golden_status` "absent".

        A load that falls back logs one WARNING on this module's logger
        (`replaylab.runtime.router`) naming the reason code and the path.
        """
        r = cls._load_checked(path, fallback_candidate=fallback_candidate, hmac_key=hmac_key,
                              threads=threads, variant=variant, clock=clock,
                              check_golden=check_golden)
        if r.loaded and host_encoder is not None:
            try:
                r.host_encoder_check = r.check_host_encoder(host_encoder)
            except GoldenError as exc:
                r._unload(exc.reason)
            else:
                if not r.host_encoder_check.ok:
                    f = r.host_encoder_check.figures
                    log.warning("router artifact %s: the host's encoder does not reproduce its %s "
                                "embeddings of the %s golden texts (min cosine %s, needs >= %s; "
                                "max |difference| %s, needs <= %s; stable decisions equal %s of %s)",
                                path, r.encoder_model_id, f.get("n_cases"), f.get("min_cosine"),
                                f.get("host_min_cosine"), f.get("max_abs_diff"),
                                f.get("host_max_abs"), f.get("stable_decisions_equal"),
                                f.get("n_stable"))
                    r._unload(ENCODER_DRIFT)
        if not r.loaded:
            log.warning("router artifact %s not loaded (reason %s): routing to the fallback "
                        "candidate %s", path, r.reason, r.fallback_candidate)
        return r

    @classmethod
    def _load_checked(cls, path: str | Path | None, *, fallback_candidate: str | None,
                      hmac_key: bytes | None, threads: int, variant: str,
                      clock: Callable[[], float], check_golden: bool) -> Router:
        r = cls._load(path, fallback_candidate, hmac_key, threads, variant, clock, check_golden)
        if not r.loaded or not check_golden:
            return r
        try:
            golden = read_golden(Path(path), r.manifest, kind=KIND)
        except GoldenError as exc:
            if exc.reason == "golden_absent":
                r.golden_status = "absent"
                return r
            return r._unload(exc.reason)
        result = r.check_golden_vectors(golden)
        if not result.ok and r.tier == "minilm" and r.variant != "fp32":
            fp32 = cls._load(path, fallback_candidate, hmac_key, threads, "fp32", clock, True)
            if fp32.loaded:
                missed = result
                result = fp32.check_golden_vectors(golden)
                result.figures[f"{r.variant}_check"] = missed.as_dict()
                fp32.requested_variant, fp32.variant_reason = variant, MISMATCH
                r = fp32
        r.golden = result
        if not result.ok:
            return r._unload(MISMATCH)
        r.golden_status = "passed"
        return r

    def _unload(self, reason: str) -> Router:
        self._head = None
        self.reason = reason
        return self

    @classmethod
    def _load(cls, path: str | Path | None, fallback_candidate: str | None,
              hmac_key: bytes | None, threads: int, variant: str,
              clock: Callable[[], float], check_encoder_golden: bool) -> Router:
        r = cls(fallback_candidate=fallback_candidate)
        r.requested_variant = variant
        if path is None or not Path(path).is_dir():
            r.reason = "missing_artifact"
            return r
        folder = Path(path)
        try:
            now = datetime.fromtimestamp(clock(), UTC)
            m = verify_manifest(folder, hmac_key=hmac_key, now=now, required_kind=KIND)
            config = json.loads(read_verified_file(folder, m, CONFIG_FILE))
            tier = (config.get("encoder") or {}).get("tier", "minilm")  # older: MiniLM
            if tier == "static":
                from replaylab.runtime.static_encoder import load_static_encoder

                enc = load_static_encoder(folder / ENCODER_DIR, now=now,
                                          check_golden_vectors=check_encoder_golden)
            elif tier == "minilm":
                from replaylab.runtime.encoder import load_encoder

                enc = load_encoder(folder / ENCODER_DIR, variant=variant, threads=threads,
                                   now=now, check_golden_vectors=check_encoder_golden)
            else:
                raise ManifestError("bad_config", f"router.json encoder tier {tier!r}")
            enc_manifest = json.loads(read_verified_file(folder, m, f"{ENCODER_DIR}/manifest.json"))
            want = m["features"][0].get("encoder_content_hash")
            if enc_manifest.get("content_hash") != want:
                raise ManifestError("encoder_mismatch", "the encoder is not the one the head "
                                                        "was trained with")
            if tier == "static":  # numpy forward pass, no ML runtime
                from replaylab.runtime.static_encoder import read_safetensors

                head = HeadScorer.from_tensors(
                    read_safetensors(read_verified_file(folder, m, HEAD_TENSORS_FILE)),
                    config["category_vocabulary"])
            else:
                head = HeadScorer.from_onnx(read_verified_file(folder, m, HEAD_FILE),
                                            config["category_vocabulary"], threads)
        except ManifestError as exc:
            r.reason = exc.reason
            return r
        except Exception:  # noqa: BLE001 - a graph or file onnxruntime refuses: fall back
            r.reason = "onnx_load"
            return r
        r.manifest, r._encoder, r._head, r._config = m, enc, head, config
        r._folder = folder
        r._static = head.kind == "numpy"
        cpt = (config.get("prompt_tokens") or {}).get("chars_per_token")
        # a missing or non-positive value: NaN, whose ceil raises in `route`, so the rules
        # answer (as any query the model fails on)
        r._chars_per_token = float(cpt) if isinstance(cpt, int | float) and cpt > 0 else math.nan
        r.variant_reason = enc.variant_reason
        r.candidates = tuple(config["candidates"])
        r.threshold = float(config["threshold"])
        r.rule = str(config.get("rule", "absolute"))
        name = config.get("fallback_candidate", r.candidates[-1])
        if r.rule not in RULES or name not in r.candidates:
            r._head = None
            r.reason = "bad_config"
            r.fallback_candidate = r.fallback_candidate or r.candidates[-1]
            return r
        r._fallback = r.candidates.index(name)
        r.version = f"{m['version']}+{m['content_hash'].removeprefix('sha256:')[:12]}"
        if r.fallback_candidate is None:
            r.fallback_candidate = name
        return r

    def check_golden_vectors(self, golden: dict) -> GoldenCheck:
        """Route the artifact's golden queries here and compare with the exporting machine's
        answers for this encoder variant: max |P(success) difference| <= `<variant>_prob_abs`,
        and every decision whose margin from the threshold exceeds what that difference can
        move (2x the tolerance under the margin rule, 1x under absolute) must agree."""
        with Timer() as timer:
            v = self.variant
            tol = golden["tolerances"]
            cases = golden["cases"]
            inputs = [c["input"] for c in cases]
            got = [self.route(str(i.get("text", "")), i.get("category"), i.get("prompt_tokens"))
                   for i in inputs]  # one query per call: the serving path
            expected = [c["expected"].get(v) for c in cases]
            figures: dict[str, Any] = {"n_cases": len(cases), "variant": v}
            prob_tol = float(tol.get(f"{v}_prob_abs", 0.0))
            if all(isinstance(e, dict) for e in expected) and not any(d.fallback for d in got):
                want = np.array([e["success_prob"] for e in expected], dtype=np.float64)
                have = np.array([[d.scores.get(c, np.nan) for c in self.candidates]
                                 for d in got], dtype=np.float64)
                figures[f"{v}_prob_max_abs"] = max_abs_diff(want, have)
                moved = prob_tol * (2.0 if self.rule == "margin" else 1.0)
                share, n_stable = stable_agreement(
                    [e["candidate"] for e in expected], [d.candidate for d in got],
                    np.array([e["margin"] for e in expected]), moved)
                figures.update(stable_decision_agreement=share, n_stable=n_stable,
                               decision_agreement=float(np.mean(
                                   [e["candidate"] == d.candidate
                                    for e, d in zip(expected, got, strict=True)])))
        return check(figures, {f"{v}_prob_max_abs": ("<=", prob_tol),
                               "stable_decision_agreement": (
                                   ">=", float(tol.get("stable_decision_agreement", 1.0)))},
                     timer.seconds)

    # ------------------------------------------------------------------ routing
    def route(self, text: str, category: str | None = None,
              prompt_tokens: float | None = None, *,
              keep_embedding: bool = False) -> RouteDecision:
        """Route one query (see the module docstring); the same answer as `route_batch`
        with the per-row decision in plain floats (`routing.choose_one`). keep_embedding:
        the decision carries the query's embedding (`RouteDecision.embedding`; what a
        session binder logs as `prompt_embedding`), at no extra encoding cost."""
        head = self._head
        if head is None:  # not loaded
            return self.route_batch([text], [category], [prompt_tokens])[0]
        try:
            emb = self._encoder.encode_one(text)
            if self._static:  # static tier: no batch arrays at all
                row = head.proba_row(emb, head.code(category),
                                     float(prompt_tokens) if prompt_tokens is not None else
                                     float(math.ceil(len(text) / self._chars_per_token)))
            else:
                row = self._scores([text], [category], [prompt_tokens], emb[None, :])[0].tolist()
        except Exception:  # noqa: BLE001 - the model failed on this input: the rules answer
            return self.route_by_rules(text, category, prompt_tokens)
        k = choose_one(row, self.threshold, fallback=self._fallback, rule=self.rule)
        return RouteDecision(self.candidates[k], dict(zip(self.candidates, row, strict=True)),
                             self.threshold, self.version, variant=self._encoder.variant,
                             embedding=emb if keep_embedding else None)

    def route_embedding(self, embedding: Any, category: str | None = None,
                        prompt_tokens: float | None = None) -> RouteDecision:
        """Route one query on an embedding the host computed: (d,) floats (float32; the
        artifact encoder's output: all-MiniLM-L6-v2 mean-pooled, L2-normalized for the
        MiniLM tier). `prompt_tokens` None: the training mean (there is no text to count).
        The head and decision of `route`, so `route_embedding(route(t, c, p,
        keep_embedding=True).embedding, c, p)` has `route`'s scores bit for bit. The
        decision's `variant` is "host". Not loaded: the fallback candidate, as `route`.
        ValueError for an embedding of the wrong shape or with a NaN or infinite value, and
        for infinite prompt_tokens (the Rust crate's `dimension` / `bad_input`)."""
        head = self._head
        if head is None:
            return self.route_batch([""], [category], [prompt_tokens])[0]
        emb = np.asarray(embedding, dtype=np.float32)
        if emb.shape != (self.dimension,) or not np.isfinite(emb).all():
            raise ValueError(f"embedding of shape {emb.shape} (finite: "
                             f"{bool(np.isfinite(emb).all())}); the head takes "
                             f"({self.dimension},) finite float32 values")
        t = float(prompt_tokens) if prompt_tokens is not None else math.nan
        if math.isinf(t):
            raise ValueError("prompt_tokens is infinite")
        if self._static:
            row = head.proba_row(emb, head.code(category), t)
        else:
            row = head.proba(emb[None, :], [category], np.array([t]))[0].tolist()
        k = choose_one(row, self.threshold, fallback=self._fallback, rule=self.rule)
        return RouteDecision(self.candidates[k], dict(zip(self.candidates, row, strict=True)),
                             self.threshold, self.version, variant="host")

    @property
    def dimension(self) -> int | None:
        """The embedding dimension the head takes; None when not loaded."""
        return None if self._encoder is None else int(self._encoder.dimension)

    @property
    def encoder_model_id(self) -> str | None:
        """The model id of the artifact's encoder (what a host's embedding must come from)."""
        return None if self.manifest is None else self.manifest["features"][0].get("model")

    def golden_triples(self) -> list[dict]:
        """The MiniLM tier's golden (text, embedding, decision) triples, in golden.json order:
        each {"input": {text, category, prompt_tokens}, "embedding": [d floats], "candidate",
        "success_prob", "margin"}. GoldenError (`golden_absent`, `golden_invalid`) when the
        artifact has none."""
        if self.manifest is None or self._folder is None:
            raise GoldenError("golden_absent", "the router is not loaded")
        golden = read_golden(self._folder, self.manifest, kind=KIND)
        out = []
        for i, case in enumerate(golden["cases"]):
            e = case["expected"].get(TRIPLE_VARIANT) or {}
            if not isinstance(e.get("embedding"), list):
                raise GoldenError("golden_invalid", f"case {i}: no expected.{TRIPLE_VARIANT}."
                                                    "embedding (golden triples are written for "
                                                    "MiniLM-tier routers)")
            out.append({"input": case["input"], "embedding": e["embedding"],
                        "candidate": e["candidate"], "success_prob": e["success_prob"],
                        "margin": e["margin"]})
        return out

    def check_host_encoder(self, embed: Callable[[str], Any]) -> GoldenCheck:
        """Check a host's encoder (text -> (d,) embedding) on the golden triples: every
        cosine to the stored embedding >= `host_min_cosine`, every |difference| <=
        `host_max_abs` (golden.json `tolerances`), and routed on the host's embeddings
        (`route_embedding`, the prompt tokens `route` would use), every decision whose stored
        margin exceeds what `host_prob_abs` can move (2x under the margin rule) equal. The
        same check as `replaylab-route verify-encoder`. GoldenError when there are no triples."""
        with Timer() as timer:
            golden = read_golden(self._folder, self.manifest, kind=KIND)
            tol = golden["tolerances"]
            missing = [k for k in ("host_min_cosine", "host_max_abs", "host_prob_abs")
                       if k not in tol]
            if missing:
                raise GoldenError("golden_invalid", f"golden.json tolerances lack {missing}")
            triples = self.golden_triples()
            want = np.array([t["embedding"] for t in triples], dtype=np.float32)
            host = np.stack([np.asarray(embed(str(t["input"]["text"])), dtype=np.float32)
                             for t in triples])
            if host.shape != want.shape:
                raise ValueError(f"host embeddings {host.shape}, the artifact's {want.shape}")
            cos = row_cosines(want, host)
            cos = np.where(np.isnan(cos), -np.inf, cos)
            got = [self.route_embedding(h, t["input"].get("category"), self.prompt_tokens(
                str(t["input"].get("text", "")), t["input"].get("prompt_tokens")))
                   if np.isfinite(h).all() else None for h, t in zip(host, triples, strict=True)]
            moved = float(tol["host_prob_abs"]) * (2.0 if self.rule == "margin" else 1.0)
            stable = [abs(t["margin"]) > moved for t in triples]
            same = [d is not None and d.candidate == t["candidate"]
                    for d, t in zip(got, triples, strict=True)]
            figures = {"n_cases": len(triples), "encoder_model_id": self.encoder_model_id,
                       "min_cosine": float(cos.min()) if len(cos) else None,
                       "host_min_cosine": float(tol["host_min_cosine"]),
                       "max_abs_diff": max_abs_diff(want, host),
                       "host_max_abs": float(tol["host_max_abs"]),
                       "worst_case": int(np.argmin(cos)) if len(cos) else None,
                       "prob_max_abs": max_abs_diff(
                           [t["success_prob"] for t in triples],
                           [[d.scores[c] for c in self.candidates] if d else
                            [np.nan] * len(self.candidates) for d in got]),
                       "host_prob_abs": float(tol["host_prob_abs"]),
                       "decisions_equal": int(sum(same)), "n_stable": int(sum(stable)),
                       "stable_decisions_equal": int(sum(s and q for s, q in
                                                          zip(stable, same, strict=True))),
                       "stable_decisions_all_equal": float(all(q for s, q in
                                                                zip(stable, same, strict=True)
                                                                if s))}
        return check(figures, {"min_cosine": (">=", figures["host_min_cosine"]),
                               "max_abs_diff": ("<=", figures["host_max_abs"]),
                               "stable_decisions_all_equal": (">=", 1.0)}, timer.seconds)

    def prompt_tokens(self, text: str, prompt_tokens: float | None = None) -> float:
        """The prompt tokens `route` scores `text` with: the given count, else
        ceil(len(text) / chars_per_token); what `route_embedding` needs for `route`'s
        answer on the same query."""
        return float(prompt_tokens) if prompt_tokens is not None else \
            float(math.ceil(len(text) / self._chars_per_token))

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
            return [self.route_by_rules(t, c, p) for t, c, p in zip(texts, categories, tokens,
                                                                     strict=True)]
        chosen = choose_by_threshold(prob, self.threshold, fallback=self._fallback, rule=self.rule)
        return [RouteDecision(self.candidates[int(k)],
                              {c: float(v) for c, v in zip(self.candidates, row, strict=True)},
                              self.threshold, self.version, variant=self.variant)
                for k, row in zip(chosen, prob, strict=True)]

    def _scores(self, texts: Sequence[str], categories: list, tokens: list,
                emb: np.ndarray | None = None) -> np.ndarray:
        if emb is None:
            emb = (self._encoder.encode_one(texts[0])[None, :] if len(texts) == 1
                   else self._encoder.encode(list(texts)))
        cpt = float(self._config["prompt_tokens"]["chars_per_token"])
        pt = np.array([float(p) if p is not None else math.ceil(len(t) / cpt)
                       for t, p in zip(texts, tokens, strict=True)], dtype=np.float64)
        return self._head.proba(emb, categories, pt)

    def route_by_rules(self, text: str, category: str | None = None,
                       tokens: float | None = None) -> RouteDecision:
        """The artifact's scenario rules (task -> candidate, long prompts): what answers a
        query the model fails on (`reason` model_error). Needs a loaded artifact."""
        rules = self._config.get("rules")
        if not isinstance(rules, dict) or "default_candidate" not in rules:  # no usable rules
            cand = self.fallback_candidate or (self.candidates[self._fallback] if self.candidates
                                               else None)
            if cand is None:
                raise ValueError("no artifact rules and no fallback_candidate")
            return RouteDecision(cand, version=self.version, fallback=True,
                                 reason="model_error", decision="fallback")
        cpt = self._chars_per_token if math.isfinite(self._chars_per_token) else 4.0
        length = float(tokens) if tokens is not None else math.ceil(len(text or "") / cpt)
        if rules.get("long_prompt_tokens") is not None and length > rules["long_prompt_tokens"]:
            cand, why = rules["long_prompt_candidate"], "rules:long_prompt"
        elif category is not None and str(category) in (rules.get("task_candidate") or {}):
            cand, why = rules["task_candidate"][str(category)], f"rules:task:{category}"
        else:
            cand, why = rules["default_candidate"], "rules:default"
        return RouteDecision(cand, version=self.version, fallback=True, reason="model_error",
                             decision=why)

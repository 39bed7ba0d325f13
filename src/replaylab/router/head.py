"""The router's learned head: an MLP predicting each candidate's success (and cost) per prompt.

Inputs of prompt i (what a router knows before dispatch):
    e_i      (d,)  sentence embedding (MiniLM, d = 384, L2-normalized)
    c_i            decision/task category; a vocabulary is learned at fit, categories
                   seen fewer than `min_category_count` times, unseen or missing
                   ones share an `other` slot (code V)
    t_i            prompt tokens; x = (log1p(max(t, 0)) - mu_t) / sd_t, NaN -> 0
The network (every preprocessing step inside, so the ONNX graph is the model):
    z = [ (e - mu_e) / sd_e ,  Emb(c) (category_dim) ,  x ]
    h = Dropout(ReLU(W_2 Dropout(ReLU(W_1 z))))                  hidden = (256, 128)
    s = W_s h   (K,)  success logits;    g = W_c h   (K,)  log-cost per candidate
    p_k = sigmoid(a_k s_k + b_k)  (Platt; a = 1, b = 0 uncalibrated)
    cost_k = cost_scale * (exp(max(g_k, 0)) - 1)
At d = 384, K = 2..9 and a few dozen categories this is ~140K parameters.

Training rows are observed (prompt, action) outcomes: row j = (i_j, a_j, r_j, w_j,
cost_j). Bandit rows from exploration carry w = 1/propensity (`ips_weights`,
clipped at `max_weight`); full-information replay rows w = 1. Only the observed
action's outputs enter the loss (a masked multi-output model):

    L = sum_j w_j [ BCE(s_{i_j, a_j}, r_j) + lambda (g_{i_j, a_j} - log1p(cost_j / cost_scale))^2 ]
        / sum_j w_j

BCE takes graded rewards r in [0, 1] as soft labels. Why the weights: the
logging policy chooses each candidate more often where it expects it to succeed,
possibly on information the head does not see; the IPS-weighted empirical risk
is unbiased for the risk under the prompt distribution (the direct method fitted
by counterfactual risk minimization: Swaminathan & Joachims, "Counterfactual Risk
Minimization", ICML 2015; Dudik, Langford & Li, ICML 2011). Clipping trades that
bias for variance (a weight of 160 from a 5% exploration over 8 others is cut to 20).

Fitting: Adam, mini-batches, early stopping on a validation slice of the rows
grouped by prompt (a prompt's rows never straddle train and validation), the best
epoch's weights kept. Seeded and deterministic: the run forks torch's RNG (the
global state is left as it was) and uses `num_threads` threads (restored after).
A fraction `category_dropout` of training rows see the `other` category so that
slot learns the category-free prediction a new task will get.

Distillation (`teachers` = M > 1): early stopping ends a fit after a few epochs
(on MMLU's subjects after one or two), so one head's per-prompt part is mostly the
noise of its initialisation and batch order. The M teachers are fitted as above
with seeds `member_seed(seed, j)` (teacher 0 is the single head of `teachers` = 1);
the served head is then fitted, the same way, on soft rows: every seen training
prompt x every candidate, reward sigmoid(mean_j s_j) (the teachers' mean logit),
weight 1, cost the teachers' mean predicted cost. It is one head of the usual
shape, so the artifact, its ONNX and safetensors forms and every scorer are
unchanged; training costs M + 1 fits. Why distil rather than serve the bag: the
static tier's route is a ~100 us budget, M heads would be M times its head. Chosen
on the calibration split (docs/design/router.md, step 6): over GSM8K, MMLU and LLMRouter
at replay 0.25 (both tiers) and 1.0 (MiniLM), 3 seeds each, the mean calibration
cost_ratio_at_95 was 0.457 with 5 teachers, 0.463 for the bag served as is and
0.464 for one head (Hinton, Vinyals & Dean, "Distilling the Knowledge in a Neural
Network", 2015; Breiman, "Bagging Predictors", 1996).

Calibration (`calibrate`, on a calibration split, never the training rows):
Platt scaling per candidate (Platt 1999; Niculescu-Mizil & Caruana, ICML 2005)
is the default: two numbers per candidate, monotone, stable on the small
IPS-weighted per-candidate samples of partial feedback, and folded into the
ONNX graph. Isotonic regression (Zadrozny & Elkan, KDD 2002) is offered for large
full-information calibration sets; it is applied in numpy after the network and
is not exported. Graded rewards enter Platt's logistic fit as two weighted rows
(label 1 with weight w r, label 0 with weight w (1 - r)), which is exactly BCE
with soft labels.

Serving (`as_served`): training reports every learned decision from the head as the
runtime serves it, `replaylab.runtime.router_head.HeadScorer` over the exported graph (or
the static tier's tensors), so the decisions it judges are the shipped ones bit for bit.
`replaylab.artifacts.router_head.served_head` exports the graph and attaches its scorer:
the served copy's `predict_proba` is the scorer's (`served_`), its `report` says so.

One module, one estimator: the network (private `_Net`), its fit (distillation and the
reuse of teachers across a head selection's fits included), its calibration and its
served copy define `SuccessHead` and change together; its configuration lives in
`router/head_config.py` (torch-free, for composing configs), its inputs (`TrainingRows`,
`MetaEncoder`) in `router/inputs.py`, its export (the ONNX graph) in
`artifacts/router_head.py`, its serving scorer in `runtime/router_head.py`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from replaylab.router.head_config import CALIBRATIONS, HeadConfig
from replaylab.router.inputs import MetaEncoder, TrainingRows
from replaylab.runtime.router_head import HeadScorer, meta_arrays

# what a served head's report says made its decisions, per `HeadScorer.kind`
DECISIONS_FROM = {"onnx": "onnx head graph (runtime HeadScorer)",
                  "numpy": "numpy forward pass of head.safetensors (runtime HeadScorer, kind numpy)"}


class _Net(nn.Module):
    """Raw inputs -> (success logits (n, K), log-cost (n, K)); preprocessing in buffers.

    forward(embedding (n, d) float32, category (n,) int64, prompt_tokens (n,) float32).
    `probabilities` adds the Platt layer and the cost transform (what ONNX exports).
    """

    def __init__(self, d: int, k: int, n_categories: int, config: HeadConfig) -> None:
        super().__init__()
        self.n_categories = n_categories  # V; code V is `other`
        buffers = {"emb_mean": torch.zeros(d), "emb_scale": torch.ones(d), "tok_mean": torch.tensor(
            0.0), "tok_scale": torch.tensor(1.0), "cost_scale": torch.tensor(1.0),
            "platt_a": torch.ones(k), "platt_b": torch.zeros(k)}  # set by fit / calibrate
        for name, value in buffers.items():
            self.register_buffer(name, value)
        self.category = nn.Embedding(n_categories + 1, config.category_dim)
        with torch.no_grad():  # small init; the `other` row starts at 0 (a neutral input)
            self.category.weight.normal_(0.0, 0.1)
            self.category.weight[n_categories].zero_()
        layers: list[nn.Module] = []
        width = d + config.category_dim + 1
        for h in config.hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(config.dropout)]
            width = h
        self.trunk = nn.Sequential(*layers)
        self.success = nn.Linear(width, k)
        self.log_cost = nn.Linear(width, k)
        self.wide = config.wide
        if config.wide:  # a per-category intercept and a log-length slope per candidate
            self.wide_category = nn.Embedding(n_categories + 1, k)
            self.wide_tokens = nn.Parameter(torch.zeros(k))
            with torch.no_grad():
                self.wide_category.weight.zero_()

    def forward(self, embedding: torch.Tensor, category: torch.Tensor,
                prompt_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        e = (embedding - self.emb_mean) / self.emb_scale
        v = self.n_categories
        c = torch.where((category >= 0) & (category < v), category, torch.full_like(category, v))
        t = torch.log1p(torch.clamp(prompt_tokens, min=0.0))
        t = (t - self.tok_mean) / self.tok_scale
        t = torch.where(torch.isnan(t), torch.zeros_like(t), t)
        h = self.trunk(torch.cat([e, self.category(c), t.unsqueeze(1)], dim=1))
        s = self.success(h)
        if self.wide:
            s = s + self.wide_category(c) + self.wide_tokens * t.unsqueeze(1)
        return s, self.log_cost(h)

    def probabilities(self, embedding: torch.Tensor, category: torch.Tensor,
                      prompt_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s, g = self(embedding, category, prompt_tokens)
        prob = torch.sigmoid(self.platt_a * s + self.platt_b)
        cost = self.cost_scale * (torch.exp(torch.relu(g)) - 1.0)  # no expm1 in ONNX
        return prob, cost


def parameter_count(d: int, k: int, n_categories: int, config: HeadConfig | None = None) -> int:
    """Trainable parameters of the head for embedding width d, K candidates, V categories."""
    net = _Net(d, k, n_categories, config or HeadConfig())
    return sum(p.numel() for p in net.parameters() if p.requires_grad)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with `n` torch threads, restoring the previous count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def grouped_validation_mask(row: np.ndarray, share: float, seed: int) -> np.ndarray:
    """(m,) bool: rows whose prompt falls in a seeded `share` of the distinct prompts."""
    prompts = np.unique(row)
    rng = np.random.default_rng(seed)
    n_val = max(1, int(round(share * len(prompts)))) if len(prompts) > 1 else 0
    val = rng.choice(prompts, size=n_val, replace=False)
    return np.isin(row, val)


class SuccessHead:
    """MLP success/cost head (see the module docstring); sklearn-style.

    fit(embedding (n, d), meta, rows: TrainingRows, n_candidates=None) -> self;
    calibrate(embedding, meta, rows) -> self; predict_proba / predict_cost -> (n, K).
    meta: mapping or DataFrame with `category` (n,) and `prompt_tokens` (n,) (see
    `meta_arrays`). Learned: net_, encoder_, n_candidates_, dim_, has_cost_,
    n_parameters_, history_ (per-epoch train/val loss), best_epoch_, rows_per_candidate_,
    calibration_ (method and per-candidate parameters), teachers_ (distillation's
    teachers, or None). A served copy (`as_served`) adds served_ (the runtime's
    `HeadScorer`) and parity_.
    """

    def __init__(self, config: HeadConfig | None = None, seed: int = 0) -> None:
        self.config = config
        self.seed = seed

    # ---------------------------------------------------------------- fitting
    def fit(self, embedding: np.ndarray, meta: Any, rows: TrainingRows,
            n_candidates: int | None = None,
            teacher_cache: dict | None = None) -> SuccessHead:
        """Fit on `rows`. teacher_cache: a dict shared by the fits of one head selection
        (`router.head_select`), whose rows are a function of the clip: a `teachers` > 1 fit
        leaves its teacher 0 there, and a `teachers` = 1 fit of the same config (but
        `teachers`) and seed takes a copy of it instead of fitting it again (teacher 0 IS
        that head: the same seed, rows and config)."""
        cfg = self.config or HeadConfig()
        emb = _embedding(embedding)
        n = emb.shape[0]
        category, tokens = meta_arrays(meta, n)
        k = int(n_candidates) if n_candidates is not None else int(rows.action.max()) + 1
        if rows.row.max() >= n or rows.action.max() >= k:
            raise ValueError(f"rows index prompts < {n} and actions < {k}; got "
                             f"{rows.row.max()} and {rows.action.max()}")
        one = dataclasses.replace(cfg, teachers=1)
        key = (repr(one), int(self.seed))
        if cfg.teachers == 1:
            if teacher_cache is not None and key in teacher_cache:
                self.__dict__.update(copy.deepcopy(teacher_cache[key]).__dict__)
                return self
            self._fit_rows(emb, category, tokens, rows, k)
            self.teachers_ = None
            return self
        inputs = {"category": category, "prompt_tokens": tokens}
        teachers = [SuccessHead(one, seed=member_seed(self.seed, j)).fit(emb, inputs, rows, k)
                    for j in range(cfg.teachers)]
        seen = np.unique(rows.row)
        e_seen, m_seen = emb[seen], {name: v[seen] for name, v in inputs.items()}
        logit = np.mean([t.predict_logits(e_seen, m_seen) for t in teachers], axis=0)
        cost = None
        if teachers[0].has_cost_:
            cost = np.mean([t.predict_cost(e_seen, m_seen) for t in teachers], axis=0).ravel()
        soft = TrainingRows(np.repeat(seen, k), np.tile(np.arange(k), len(seen)),
                            (1.0 / (1.0 + np.exp(-logit))).ravel(), np.ones(len(seen) * k), cost)
        self._fit_rows(emb, category, tokens, soft, k)
        self.rows_per_candidate_ = np.bincount(rows.action, minlength=k).tolist()
        self.teachers_ = [{"seed": t.seed, "epochs": len(t.history_["train"]),
                           "best_epoch": t.best_epoch_,
                           "best_val_loss": float(min(t.history_["val"]))} for t in teachers]
        if teacher_cache is not None:
            teacher_cache[key] = teachers[0]
        return self

    def _fit_rows(self, emb: np.ndarray, category: np.ndarray, tokens: np.ndarray,
                  rows: TrainingRows, k: int) -> None:
        """One head on `rows` (the body of `fit` for `teachers` = 1)."""
        cfg = self.config or HeadConfig()
        d = emb.shape[1]
        seen = np.unique(rows.row)
        self.encoder_ = MetaEncoder(cfg.min_category_count).fit(category[seen], tokens[seen])
        codes = self.encoder_.codes(category)
        self.n_candidates_, self.dim_ = k, d
        self.has_cost_ = rows.cost is not None and bool(np.isfinite(rows.cost).any())
        rows = _clip_weights(rows, cfg.max_weight, keep_cost=self.has_cost_)
        self.rows_per_candidate_ = np.bincount(rows.action, minlength=k).tolist()
        with torch.random.fork_rng(devices=[]), torch_threads(cfg.num_threads):
            torch.manual_seed(self.seed)
            net = _Net(d, k, len(self.encoder_.vocabulary_), cfg)
            with torch.no_grad():
                mu, sd = emb[seen].mean(axis=0), emb[seen].std(axis=0)
                net.emb_mean.copy_(torch.from_numpy(mu))
                net.emb_scale.copy_(torch.from_numpy(np.where(sd > 1e-6, sd, 1.0)))
                net.tok_mean.fill_(self.encoder_.token_mean_)
                net.tok_scale.fill_(self.encoder_.token_scale_)
                if cfg.wide:
                    net.wide_category.weight.copy_(torch.from_numpy(
                        category_logits(codes, rows, k, len(self.encoder_.vocabulary_),
                                         float(cfg.prior_strength)).astype(np.float32)))
                if self.has_cost_:
                    pos = rows.cost[np.isfinite(rows.cost) & (rows.cost > 0)]
                    net.cost_scale.fill_(float(np.median(pos)) if len(pos) else 1.0)
            val = grouped_validation_mask(rows.row, cfg.val_share, self.seed)
            self.history_, self.best_epoch_ = _train(
                net, cfg, emb, codes, tokens.astype(np.float32), rows, val, self.seed)
        self.net_ = net.eval()
        self.n_parameters_ = sum(p.numel() for p in net.parameters() if p.requires_grad)
        self.calibration_ = {"method": "none"}
        self.isotonic_: list[Any] | None = None

    def calibrate(self, embedding: np.ndarray, meta: Any, rows: TrainingRows,
                  method: str | None = None, min_rows: int = 20) -> SuccessHead:
        """Fit the per-candidate calibration on rows NOT used in `fit` (calibration split).

        method: "platt" (default from the config), "isotonic" or "none". A
        candidate with fewer than `min_rows` rows or one class only keeps the
        identity (reported in `calibration_["identity"]`).
        """
        self.check_fitted()
        method = method or (self.config or HeadConfig()).calibration
        if method not in CALIBRATIONS:
            raise ValueError(f"calibration method {method!r}: must be one of {CALIBRATIONS}")
        if rows.row.max() >= len(embedding) or rows.action.max() >= self.n_candidates_:
            raise ValueError("calibration rows index prompts or actions out of range")
        rows = _clip_weights(rows, (self.config or HeadConfig()).max_weight, keep_cost=False)
        with torch.no_grad():  # back to the raw network before reading its logits
            self.net_.platt_a.fill_(1.0)
            self.net_.platt_b.zero_()
        self.isotonic_ = None
        logits = self.predict_logits(embedding, meta)[rows.row, rows.action]
        self.calibration_, a, b, self.isotonic_ = _fit_calibration(
            method, logits, rows, self.n_candidates_, min_rows)
        with torch.no_grad():
            self.net_.platt_a.copy_(torch.from_numpy(a.astype(np.float32)))
            self.net_.platt_b.copy_(torch.from_numpy(b.astype(np.float32)))
        return self

    # ---------------------------------------------------------------- prediction
    def check_fitted(self) -> None:
        """RuntimeError unless `fit` has run."""
        if not hasattr(self, "net_"):
            raise RuntimeError("SuccessHead is not fitted; call fit first")

    def _inputs(self, embedding: np.ndarray, meta: Any) -> tuple[torch.Tensor, ...]:
        self.check_fitted()
        emb = _embedding(embedding)
        if emb.shape[1] != self.dim_:
            raise ValueError(f"embedding width {emb.shape[1]}, the head was fitted on {self.dim_}")
        category, tokens = meta_arrays(meta, len(emb))
        return (torch.from_numpy(emb), torch.from_numpy(self.encoder_.codes(category)),
                torch.from_numpy(tokens.astype(np.float32)))

    def net_outputs(self, embedding: np.ndarray, meta: Any, fn: str, batch: int = 4096
                    ) -> list[np.ndarray]:
        """[success, cost] of the network's `fn` ("forward": logits and log cost;
        "probabilities": probabilities and cost), (n, K) each, computed `batch` rows at a
        time (the ONNX export's parity check compares against it)."""
        e, c, t = self._inputs(embedding, meta)
        outs: list[list[np.ndarray]] = []
        with torch.no_grad(), torch_threads((self.config or HeadConfig()).num_threads):
            for s in range(0, len(e), batch):
                res = getattr(self.net_, fn)(e[s:s + batch], c[s:s + batch], t[s:s + batch])
                outs.append([r.numpy() for r in res])
        k = self.n_candidates_
        return [np.concatenate([o[j] for o in outs]) if outs else np.zeros((0, k), np.float32)
                for j in range(2)]

    def predict_logits(self, embedding: np.ndarray, meta: Any = None) -> np.ndarray:
        """(n, K) float64 uncalibrated success logits."""
        return self.net_outputs(embedding, meta, "forward")[0].astype(np.float64)

    def predict_proba(self, embedding: np.ndarray, meta: Any = None) -> np.ndarray:
        """(n, K) float64 calibrated success probabilities, columns as the training actions;
        on a served copy (`as_served`) the runtime scorer's, else the network's."""
        served = getattr(self, "served_", None)
        if served is not None:
            return served.predict_proba(embedding, meta)
        prob = self.net_outputs(embedding, meta, "probabilities")[0].astype(np.float64)
        if self.isotonic_ is not None:
            for k, iso in enumerate(self.isotonic_):
                if iso is not None:
                    prob[:, k] = iso.predict(prob[:, k])
        return prob

    def predict_cost(self, embedding: np.ndarray, meta: Any = None) -> np.ndarray:
        """(n, K) float64 predicted USD per call (a log-scale mean: near the median cost)."""
        if not getattr(self, "has_cost_", False):
            raise ValueError("the head was fitted without costs: no cost prediction")
        return self.net_outputs(embedding, meta, "probabilities")[1].astype(np.float64)

    def report(self) -> dict:
        """Facts of the fit for the run summary (plain JSON values)."""
        self.check_fitted()
        return {"n_parameters": self.n_parameters_, "n_candidates": self.n_candidates_,
                "embedding_dim": self.dim_, "categories": len(self.encoder_.vocabulary_),
                "rows_per_candidate": self.rows_per_candidate_, "has_cost": self.has_cost_,
                "epochs": len(self.history_["train"]), "best_epoch": self.best_epoch_,
                "best_val_loss": float(min(self.history_["val"])),
                "calibration": copy.deepcopy(self.calibration_),
                "teachers": copy.deepcopy(getattr(self, "teachers_", None)),
                **({} if getattr(self, "served_", None) is None else {
                    "decisions_from": DECISIONS_FROM[self.served_.kind],
                    "onnx_parity": self.parity_})}

    # ---------------------------------------------------------------- serving
    def as_served(self, scorer: HeadScorer, parity: dict | None = None) -> SuccessHead:
        """A copy of this fitted head whose `predict_proba` is `scorer`'s, the runtime's
        scorer of its exported graph or tensors (`artifacts.router_head.served_head` builds
        it), and whose `report` says so (`decisions_from`; `onnx_parity`: torch vs
        onnxruntime on given prompts, informational, the graph decides). The network is
        shared, not copied; this head is left as it was."""
        self.check_fitted()
        served = copy.copy(self)
        served.served_, served.parity_ = scorer, parity
        return served


def member_seed(seed: int, j: int) -> int:
    """Seed of teacher j of a head seeded `seed` (j = 0: `seed` itself)."""
    if j == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed), int(j)]).generate_state(1)[0] >> 1)



def _clip_weights(rows: TrainingRows, max_weight: float | None, keep_cost: bool) -> TrainingRows:
    w = rows.weight if max_weight is None else np.minimum(rows.weight, max_weight)
    return TrainingRows(rows.row, rows.action, rows.reward, w, rows.cost if keep_cost else None)


def category_logits(codes: np.ndarray, rows: TrainingRows, k: int, v: int,
                    strength: float) -> np.ndarray:
    """(V + 1, K) start of the wide part: the weighted success of each candidate per
    category, shrunk toward the candidate's overall success with `strength` pseudo-rows,
    as a logit; row V (`other`) is the overall success.

    Why it starts there and not at zero: early stopping ends training while the
    per-prompt fit starts to overfit, which on tasks like MMLU's subjects comes
    before Adam's small steps have moved a zero-initialised intercept to the
    category's success rate; the empirical-Bayes table is where a category-only
    model would end anyway (the scenario rules' own table).
    """
    c = codes[rows.row]
    w = rows.weight.astype(np.float64)
    wr = w * rows.reward
    overall = np.clip(np.bincount(rows.action, wr, k) / np.maximum(
        np.bincount(rows.action, w, k), 1e-12), 1e-3, 1 - 1e-3)
    idx = c * k + rows.action
    sw = np.bincount(idx, w, (v + 1) * k).reshape(v + 1, k)
    swr = np.bincount(idx, wr, (v + 1) * k).reshape(v + 1, k)
    n = np.bincount(idx, minlength=(v + 1) * k).reshape(v + 1, k).astype(np.float64)
    mean = np.where(sw > 0, swr / np.maximum(sw, 1e-12), overall[None, :])
    post = np.clip((n * mean + strength * overall[None, :]) / np.maximum(n + strength, 1e-12),
                   1e-3, 1 - 1e-3)
    post[v] = overall
    return np.log(post / (1 - post))


def _embedding(embedding: np.ndarray) -> np.ndarray:
    emb = np.ascontiguousarray(embedding, dtype=np.float32)
    if emb.ndim != 2 or not np.isfinite(emb).all():
        raise ValueError(f"embedding must be a finite (n, d) array, got shape {emb.shape}")
    return emb


def _train(net: _Net, cfg: HeadConfig, emb: np.ndarray, codes: np.ndarray,
           tokens: np.ndarray, rows: TrainingRows, val: np.ndarray, seed: int
           ) -> tuple[dict[str, list[float]], int]:
    """Adam with early stopping on the validation rows; loads the best epoch's weights.

    Loss of a batch B: sum_{j in B} w_j l_j / (|B| mean_train(w)), l_j = BCE on the
    observed action's logit (+ lambda x squared log-cost error where the cost is known).
    """
    E, C, T = (torch.from_numpy(x) for x in (emb, codes, tokens))
    r, a = torch.from_numpy(rows.row), torch.from_numpy(rows.action)
    y = torch.from_numpy(rows.reward.astype(np.float32))
    w = torch.from_numpy(rows.weight.astype(np.float32))
    cost_target = cost_known = None
    if rows.cost is not None:
        known = np.isfinite(rows.cost)
        target = np.log1p(np.where(known, rows.cost, 0.0) / float(net.cost_scale))
        cost_target = torch.from_numpy(target.astype(np.float32))
        cost_known = torch.from_numpy(known.astype(np.float32))
    tr, va = np.flatnonzero(~val), np.flatnonzero(val)
    w_norm = float(w[tr].mean())
    opt = torch.optim.Adam(net.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    other = torch.tensor(net.n_categories)

    def weighted_loss(idx: torch.Tensor, train: bool) -> torch.Tensor:
        i, act = r[idx], a[idx].unsqueeze(1)
        c = C[i]
        if train and cfg.category_dropout > 0:
            c = torch.where(torch.rand(len(idx)) < cfg.category_dropout, other, c)
        s, g = net(E[i], c, T[i])
        per = nn.functional.binary_cross_entropy_with_logits(
            s.gather(1, act).squeeze(1), y[idx], reduction="none")
        if cost_target is not None:
            err = g.gather(1, act).squeeze(1) - cost_target[idx]
            per = per + cfg.cost_loss_weight * cost_known[idx] * err * err
        return (w[idx] * per).sum()

    history: dict[str, list[float]] = {"train": [], "val": []}
    best, best_state, best_epoch, wait = np.inf, copy.deepcopy(net.state_dict()), 0, 0
    for epoch in range(cfg.max_epochs):
        net.train()
        perm = tr[torch.randperm(len(tr)).numpy()]
        total = 0.0
        for s in range(0, len(perm), cfg.batch_size):
            idx = torch.from_numpy(perm[s:s + cfg.batch_size])
            loss = weighted_loss(idx, True) / (w_norm * len(idx))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        history["train"].append(total / len(tr))
        net.eval()
        with torch.no_grad():
            v = (float(weighted_loss(torch.from_numpy(va), False)) / float(w[va].sum())
                 if len(va) else history["train"][-1])
        history["val"].append(v)
        if v < best - 1e-5:
            best, best_state, best_epoch, wait = v, copy.deepcopy(net.state_dict()), epoch, 0
        else:
            wait += 1
            if wait >= cfg.patience:
                break
    net.load_state_dict(best_state)
    return history, best_epoch


def _fit_calibration(method: str, logits: np.ndarray, rows: TrainingRows, k: int,
                     min_rows: int) -> tuple[dict, np.ndarray, np.ndarray, list | None]:
    """Per-candidate Platt (a, b) or isotonic maps from calibration logits (m,) of rows."""
    from sklearn.isotonic import IsotonicRegression  # noqa: PLC0415 - training-side only
    from sklearn.linear_model import LogisticRegression  # noqa: PLC0415

    a, b = np.ones(k), np.zeros(k)
    iso: list | None = [None] * k if method == "isotonic" else None
    report: dict[str, Any] = {"method": method, "identity": [],
                              "rows": np.bincount(rows.action, minlength=k).tolist()}
    for j in range(k if method != "none" else 0):
        m = rows.action == j
        s, y, w = logits[m], rows.reward[m], rows.weight[m]
        pos, neg = w * y, w * (1.0 - y)
        if m.sum() < min_rows or pos.sum() <= 0 or neg.sum() <= 0:
            report["identity"].append(j)
        elif method == "platt":  # soft labels as two weighted rows = BCE with soft targets
            x = np.concatenate([s, s])[:, None]
            lab = np.r_[np.ones(len(s)), np.zeros(len(s))]
            sw = np.r_[pos, neg]
            lr = LogisticRegression(C=1e6, max_iter=1000).fit(x[sw > 0], lab[sw > 0],
                                                             sample_weight=sw[sw > 0])
            a[j], b[j] = float(lr.coef_[0, 0]), float(lr.intercept_[0])
        else:
            iso[j] = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(
                1.0 / (1.0 + np.exp(-s)), y, sample_weight=w)
    if method == "platt":
        report.update(a=a.tolist(), b=b.tolist())
    return report, a, b, iso

"""Censoring-aware training of the demand quantiles: the loss, and the choice of variant.

A request cut at its cap (`finish_reason=length`) proves demand >= its observed
total; it never says by how much. Three ways to train on it (config
`demand.censoring.method`, docs/design/demand-target.md):

- `none`: drop it (the label rows alone; biased low near the cap);
- `realized`: take the observed total as the label; the hint is clipped to
  prompt + cap anyway, so the cap bounds what this can over-predict;
- `pinball`: the censored pinball loss. For a label y it is the pinball loss
  rho_tau(y - q); for a lower bound c it is tau * max(c - q, 0): falling short of
  the bound is penalised like an under-prediction, anything above it is free
  (the demand beyond c is unknown). Its (sub)gradient is what LightGBM boosts.

LightGBM's own `quantile` objective cannot express "free above c", so the
pinball variant is a custom objective. A custom objective boosts from a zero
score and has no quantile leaf renewal, so it starts from the native booster
(LightGBM's quantile objective, fitted on the label rows) and adds `rounds`
trees to it (`init_model`): the booster keeps every tree, so the exact ONNX
export and its parity hold unchanged.

`select_censoring` is the `auto` rule, on the calibration split: keep `none`
unless a variant raises the capped rows' hi >= observed by at least
`min_capped_gain` (a few rows' worth is noise, not a win) without raising the
uncensored mean pinball by more than `max_pinball_increase` (relative).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

NONE, REALIZED, PINBALL = "none", "realized", "pinball"
VARIANTS = (NONE, REALIZED, PINBALL)


def censored_pinball_gradient(pred: np.ndarray, y: np.ndarray, censored: np.ndarray,
                              alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """(gradient, hessian) of the censored pinball loss at `pred`, per row (n,) each.

    Label rows: d/dq rho_alpha(y - q) = 1 - alpha above y, -alpha below (at a tie,
    LightGBM's convention: 1 - alpha). Lower-bound rows: -alpha below the bound,
    0 at or above it. Hessian 1 (the loss is piecewise linear: gradient steps).
    """
    above = pred >= y
    grad = np.where(above, 1.0 - alpha, -alpha)
    grad[above & censored] = 0.0
    return grad, np.ones_like(grad)


def censored_pinball_objective(alpha: float, censored: np.ndarray
                               ) -> Callable[[np.ndarray, object], tuple[np.ndarray, np.ndarray]]:
    """A LightGBM custom objective (`params["objective"]`) for one quantile level.

    censored: bool (n,), aligned with the training Dataset's rows: True where the
    label is only a lower bound.
    """
    censored = np.asarray(censored, dtype=bool)

    def objective(pred: np.ndarray, dataset) -> tuple[np.ndarray, np.ndarray]:
        return censored_pinball_gradient(pred, dataset.get_label(), censored, alpha)

    return objective


def censored_pinball_loss(y: np.ndarray, q: np.ndarray, censored: np.ndarray,
                          alpha: float) -> float:
    """Mean censored pinball loss (see the module docstring): y, q, censored (n,)."""
    y, q = np.asarray(y, dtype="float64"), np.asarray(q, dtype="float64")
    diff = y - q
    loss = np.where(diff >= 0, alpha * diff, (alpha - 1.0) * diff)
    loss = np.where(np.asarray(censored, dtype=bool), alpha * np.maximum(diff, 0.0), loss)
    return float(loss.mean()) if loss.size else float("nan")


def select_censoring(candidates: Mapping[str, Mapping], min_rows: int,
                     max_pinball_increase: float, min_capped_gain: float = 0.0
                     ) -> tuple[str, str]:
    """The `auto` choice: (variant, one-line reason).

    candidates: variant -> calibration figures {"mean_pinball": uncensored rows,
    "capped_n": censored rows, "capped_hi_ge_obs": share of them with hi >=
    observed (None when capped_n is 0), optionally "halves_mean_pinball": the
    uncensored mean pinball on the earlier and later half of the split}; must
    hold "none". The pinball limit holds on the whole split and on each half:
    under drift a variant that is free on the whole window can still cost on its
    later part, the part closest to what it will serve.
    """
    base = candidates[NONE]
    n = int(base["capped_n"])
    if n < min_rows:
        return NONE, (f"{n} censored calibration rows < censoring.min_rows={min_rows}: "
                      "too few to judge a variant")
    judged, eligible = [], []
    for name, c in candidates.items():
        if name == NONE:
            continue
        gain = float(c["capped_hi_ge_obs"]) - float(base["capped_hi_ge_obs"])
        worse = float(c["mean_pinball"]) / float(base["mean_pinball"]) - 1.0
        halves = [float(a) / float(b) - 1.0 for a, b in
                  zip(c.get("halves_mean_pinball") or [], base.get("halves_mean_pinball") or [],
                      strict=False)]
        ok = (gain > 0 and gain >= min_capped_gain
              and max([worse, *halves]) <= float(max_pinball_increase) + 1e-12)
        judged.append(f"{name} capped {gain:+.3f}, pinball {worse:+.2%}"
                      + (f" (halves {', '.join(f'{h:+.2%}' for h in halves)})" if halves else "")
                      + (" (eligible)" if ok else ""))
        if ok:
            eligible.append(name)
    if not eligible:
        return NONE, (f"no variant raises the capped rows' hi >= observed by {min_capped_gain:g}"
                      f" or more within a {max_pinball_increase:.0%} pinball increase: "
                      + "; ".join(judged))
    best = max(eligible, key=lambda k: (float(candidates[k]["capped_hi_ge_obs"]),
                                        -float(candidates[k]["mean_pinball"])))
    return best, f"{best} chosen on {n} censored calibration rows: " + "; ".join(judged)

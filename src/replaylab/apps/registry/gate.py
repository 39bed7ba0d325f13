"""The promotion gate: may version `mv` take the alias from `champion`?

A version's own verdict (its `go` tag, recomputed from its verified manifest
when given), and for demand, against another champion, the champion's scores on
the challenger's own test rows (`replaylab.apps.registry.rescore`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from replaylab.apps.registry.rescore import vs_prefix
from replaylab.apps.registry.tags import TAG


def gate(mv: Any, champion: Any | None, own: dict[str, str] | None = None) -> tuple[bool,
                                                                                list[str]]:
    """(passed, reasons) of the promotion gate for version `mv` against `champion`.

    First the version's own verdict (tag `go`: router, the pipeline's go/no-go; demand,
    the run's `gate` as its report shows it). Demand against another champion: the
    champion re-scored on the challenger's own test rows (`replaylab.vs.v<champion>.*`,
    same code for both), and the upper bound of the paired bootstrap interval of
    (challenger - champion) mean pinball must be below 0; without such a score (or one
    recorded before intervals were), refused with the command that scores it.

    own: the version's verdict tags recomputed from its verified manifest
    (`version_tags`); given, they decide, and a stored tag that disagrees with them
    (anyone with write access can edit tags in the MLflow UI) refuses the promotion,
    naming both values. The verdict word (GO, NO-GO, NOT ENOUGH EVIDENCE) must be GO.
    A demand challenger that beats the champion but is itself not GO is told exactly that.
    """
    kind, reasons = mv.tags.get(TAG + "kind"), []
    said = own if own is not None else mv.tags
    verdict = said.get(TAG + "verdict") or ("GO" if said.get(TAG + "go") == "true" else "NO-GO")
    go = said.get(TAG + "go") == "true" and verdict == "GO"
    reasons.append(f"{verdict} (go={str(go).lower()}): {said.get(TAG + 'go_reasons', '')}")
    edited = tag_disagreements(mv, own) if own is not None else []
    if edited:
        return False, edited + reasons
    if kind != "demand":
        return go, reasons
    if champion is None or champion.version == mv.version:
        reasons.append("no other champion: pinball not compared")
        return go, reasons
    ok, more = _against_champion(mv, champion)
    if ok and not go:
        more.insert(0, f"v{mv.version} beats champion v{champion.version} (the paired "
                    f"interval's upper bound is below 0) but is itself {verdict}: refused, a "
                    "challenger must pass its own gate too")
    return go and ok, more + reasons if ok and not go else reasons + more


def tag_disagreements(mv: Any, own: dict[str, str]) -> list[str]:
    """One reason per stored tag of version `mv` that differs from what its verified
    manifest says (`own`); empty when they agree. A tag the version does not carry is not
    compared (older versions were registered with fewer tags)."""
    out = []
    for key, value in own.items():
        stored = mv.tags.get(key)
        if stored is not None and stored != value:
            out.append(f"the version's tag {key}={stored[:80]} disagrees with its verified "
                       f"manifest ({key.removeprefix(TAG)}={value[:80]}): refused (restore "
                       "the tag, or register the artifact again)")
    return out


def _against_champion(mv: Any, champion: Any) -> tuple[bool, list[str]]:
    """The demand challenger's pinball against the champion's on its own rows (every
    reason is listed, whatever the version's own verdict)."""
    reasons: list[str] = []
    prefix, t = vs_prefix(champion.version), mv.tags
    score_it = (f"score it there: python -m export compare name={mv.name} "
                f"version={mv.version} alias=<its alias> ledger=<this version's ledger>")
    if t.get(prefix + "challenger_better") is None or \
            t.get(prefix + "champion_content_hash") != champion.tags.get(TAG + "content_hash"):
        window = ("on the same test window" if champion.tags.get(TAG + "test_window")
                  == t.get(TAG + "test_window") else
                  f"and was tested on another window ({champion.tags.get(TAG + 'test_window')} "
                  f"vs {t.get(TAG + 'test_window')})")
        reasons.append(f"champion v{champion.version} was never scored on this version's test "
                       f"rows {window}: no paired interval of the pinball difference, refused; "
                       + score_it)
        return False, reasons
    v = f"vs.v{champion.version}."
    new, old = _float_tag(mv, v + "challenger.mean_pinball"), _float_tag(
        mv, v + "champion.mean_pinball")
    same = t.get(prefix + "same_rows") == "true"
    try:
        lo, hi = (float(x) for x in json.loads(t.get(prefix + "delta_ci") or "null"))
    except (TypeError, ValueError):
        lo = hi = math.nan
    delta = _float_tag(mv, v + "delta_mean_pinball")
    significant = math.isfinite(hi) and hi < 0
    ok = same and significant
    if not math.isfinite(hi):
        verdict = ("no paired interval recorded (scored before intervals were): refused; "
                   "re-" + score_it)
    else:
        verdict = (f"challenger − champion {delta:+.4g} (paired 95% interval "
                   f"[{lo:+.4g}, {hi:+.4g}], {t.get(prefix + 'delta_resampled', '')}): "
                   + ("better, the upper bound is below 0" if significant else
                      "not shown better, the upper bound is not below 0"))
    reasons.append(f"champion v{champion.version} re-scored on this version's "
                   f"{t.get(prefix + 'rows')} test rows ({t.get(prefix + 'rows_source')}, "
                   f"quantiles {t.get(prefix + 'levels')}): mean pinball {new:.4g} vs "
                   f"champion's {old:.4g}; {verdict}; coverage "
                   f"{_float_tag(mv, v + 'challenger.coverage'):.3f} vs "
                   f"{_float_tag(mv, v + 'champion.coverage'):.3f}"
                   + ("" if same else "; the champion did not answer every row: refused")
                   + ("; warning: the champion was fitted on a time window overlapping "
                      "these rows (its score may be optimistic)"
                      if t.get(prefix + "champion_fit_overlap") == "true" else ""))
    return ok, reasons



def _float_tag(mv: Any, key: str) -> float:
    try:
        return float(mv.tags.get(TAG + key))
    except (TypeError, ValueError):
        return math.nan

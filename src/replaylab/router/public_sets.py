"""The public outcome sets of docs/results/router.md and the figures read off each run.

`public_outcome_sets(root, gsm8k_csv, sets)` yields (name, outcomes-v1 frame,
router config overrides) for RouteLLM GSM8K and MMLU, LLMRouter (RouterDC) and
RouterArena, in that order (`sets`: a subset of `SETS`, only those are read); `root` is the shared outcomes folder (see
../shared/data/SOURCES.md). Candidates are ordered cheapest first: LLMRouter by
list price (input + output USD per million; per-call cost MODELED as that price x
250 tokens), RouterArena by its measured mean cost per call. `result_row` is the
one line per run the results table is made of.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd

SETS = ("gsm8k", "mmlu", "llmrouter", "routerarena")
POLICIES = ("learned", "rules", "rules_equal", "random", "knn", "lgbm", "oracle")
LLMROUTER_TOKENS_PER_CALL = 250  # modeled call size for LLMRouter's list prices


def public_outcome_sets(root: str | Path, gsm8k_csv: str | Path, sets: tuple[str, ...] = SETS
                        ) -> Iterator[tuple[str, pd.DataFrame, dict]]:
    """(name, outcomes, overrides of the router config) per set of `sets` (in `SETS` order);
    each set is read when reached. An unknown name is a ValueError naming the choices."""
    from replaylab.sources.routellm import import_routellm_gsm8k, import_routellm_mmlu
    from replaylab.sources.routerarena import import_routerarena

    unknown = sorted(set(sets) - set(SETS))
    if unknown:
        raise ValueError(f"unknown outcome set(s) {unknown}: choose from {list(SETS)}")
    if "gsm8k" in sets:
        yield "gsm8k", import_routellm_gsm8k(str(gsm8k_csv)), {}
    if "mmlu" in sets:
        yield "mmlu", import_routellm_mmlu(f"{root}/routellm/mmlu/responses"), {}
    if "llmrouter" in sets:
        yield _llmrouter(root)
    if "routerarena" in sets:
        ra = import_routerarena(f"{root}/routerarena")
        yield "routerarena", ra, {"candidates": list(ra.groupby("candidate").cost.mean()
                                                     .sort_values().index),
                                  "cost": {"prices": {}, "call_cost_usd": {}}}


def _llmrouter(root: str | Path) -> tuple[str, pd.DataFrame, dict]:
    from replaylab.sources.llmrouter import import_llmrouter, load_llmrouter_prices

    prices = load_llmrouter_prices(f"{root}/llmrouter/llm_candidates/default_llm.json")
    lr = import_llmrouter(f"{root}/llmrouter/dcrouter_preprocessed")
    c = prices.loc[sorted(lr.candidate.unique())]
    c = c.assign(t=c.input_usd_per_million + c.output_usd_per_million).sort_values(
        ["t", "output_usd_per_million"])  # cheapest first, by list price
    return "llmrouter", lr, {"candidates": list(c.index), "cost": {
        "prices": {}, "call_cost_usd": {k: float(r.t * LLMROUTER_TOKENS_PER_CALL / 1e6)
                                        for k, r in c.iterrows()}}}


def result_row(name: str, share: float, seed: int, summary: dict, seconds: float,
               tier: str = "minilm") -> dict:
    """One run's row: test cost_ratio_at_95 and APGR per policy (`<policy>_cr95`,
    `<policy>_apgr`, rules_equal included), the paired gaps of the learned router's
    cost_ratio_at_95 to both rules variants, OPE, the verdict (its word, objective, the
    served point's figures, the OPE gate's word, the data a NOT ENOUGH EVIDENCE needs) and
    its baseline."""
    s = summary
    r = {"data": name, "tier": tier, "replay": share, "seed": seed, "prompts": s["prompts"],
         "explored": s["exploration"]["explored_sessions"], "seconds": round(seconds, 1)}
    for p in POLICIES:
        r[f"{p}_cr95"] = s["test"].get(p, {}).get("cost_ratio_at_95")
        r[f"{p}_apgr"] = s["test"].get(p, {}).get("apgr")
    for pair, g in (s.get("test_gaps") or {}).items():
        r[f"gap_{pair.replace('-', '_vs_')}_cr95"] = (g["mean"], g["ci"])
    r["rules_equal_prompts"] = (s.get("rules_equal") or {}).get("prompts")
    r.update({f"ope_{k}": (s["ope"][k]["estimate"], s["ope"][k]["ci"])
              for k in ("ips", "snips", "dr")})
    r.update(truth=s["ope"]["truth"], go=s["go"], go_baseline=s.get("go_baseline"),
             go_reasons=s["go_reasons"], verdict=s.get("verdict"),
             objective=(s.get("objective") or {}).get("label"),
             served={k: (s.get("headline") or {}).get(k) for k in (
                 "quality", "cost", "cost_vs_strong_only", "cost_vs_incumbent")},
             ope_verdict=(s["ope"].get("ope_verdict") or {}).get("verdict"),
             more_data=(s["go_detail"].get("more_data") or {}).get("text"),
             days_needed=s["go_detail"]["days_needed"])
    rep = s.get("replay") or {}
    r.update(selection=rep.get("selection"), selection_chosen=rep.get("chosen"),
             selection_why=rep.get("why"), replayed_prompts=rep.get("replayed_prompts"),
             selection_calibration=rep.get("calibration_cost_ratio"),
             plan=rep.get("plan"))
    return r

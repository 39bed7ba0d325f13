"""`python -m evaluation experiment=hint_admission`: does the demand hint change fleet outcomes?

The research question: admission that reserves KV for a request by the demand
artifact's `hint_p90` (mode `hint`) instead of the prompt plus a default token
cap (mode `none`, no estimate) or the true length (`perfect`, an oracle bound):
does it materially change SLO attainment, rejections, goodput or the capacity
needed?

1. Train a demand model on the ledger `fleet.workload` names: the seeded synthetic
   ledger (source=synthetic: sessions, caps, SLO classes, `replaylab.sources.synthetic`)
   or a ledger-v1 file (ledger=PATH, or a shipped trace), with `train_demand` (the
   same session split either way), export it with
   `export_demand` to `run_dir/artifacts/demand` and load it through the runtime
   (`DemandPredictor.load`): the hints are the artifact's, never the true lengths.
2. Size: replay the CALIBRATION window through the runtime (`replay_hints`), take
   `residual_summary`'s `sizing_multiplier` (q95 of actual / hint_p90), and size the
   pool for the in-flight KV reservation each mode plans with (hint_p90 x the
   multiplier; prompt + cap; the truth), held at the ledger's own service times.
3. Evaluate on the TEST window only (never trained or calibrated on), replicated
   over independent ledger seeds (synthetic: seed 0 = the training ledger's test
   split; the others are fresh ledgers restricted to the same window) or, for a
   ledger file, over `fleet.workload.windows` consecutive time windows of its test
   window (one ledger: the capacity comparison then has no spread across ledgers),
   each replayed through the runtime so `hint_p90` comes from the artifact. Every mode runs on the same
   hint-sized fleet (SLO, rejections, goodput) and on the fleet its own rule sizes
   (capacity: replicas, GPU-hours, and the SLO that capacity buys).
4. Paired differences per replicate, mean and 95 % t-interval; a difference is
   `material` when its interval excludes zero AND its mean is at least the stated
   threshold. `answer` says it in words, including when it is not.

The package, one role per module: `config.py` (`HintConfig` and its sections),
`artifact.py` (the training ledger and the demand artifact), `sizing.py` (replicas for
each mode's KV reservation), `replicates.py` (the hinted test workloads), `experiment.py`
(`run`: the cells and the summary), `report.py` (paired comparisons, the answer,
figures). Like every fleet experiment it imports only the harness.
"""

from replaylab.fleet.experiments.hint_admission.config import HintConfig, LedgerSpec, SizingSpec
from replaylab.fleet.experiments.hint_admission.experiment import run

__all__ = ["HintConfig", "LedgerSpec", "SizingSpec", "run"]

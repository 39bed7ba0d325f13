"""Serving policies below the router: which replica takes a request, and whether it is admitted.

Every policy here follows `sim.policy.Policy` (`admit(request, fleet, now)`,
`choose(request, eligible, fleet, now)`), only ever answers with a member of
`eligible` (the simulator's ready, same-model, same-residency set), and reads
only what a router can see: `fleet.load`, and per replica `pool_id`, `model`,
`region`, `profile`, `state`, `running`, `queued`, `kv_used`, `kv_capacity`,
`max_batch` (so `telemetry.feed.TelemetryAware` can hand them the telemetry
view instead of the live fleet). Modules:

- reference.py: `RoundRobin`, `LeastLoaded` (the simulator's default);
- spillover.py, admission.py, energy.py: the rules below; common.py: what they share.

Rules:

- `SpilloverPolicy(primary, max_load_per_replica=8)`: `primary[model]` is the
  model's preferred pool. Least-loaded (ties spread) among its eligible
  replicas while the least loaded of them has running + queued <
  max_load_per_replica; otherwise least-loaded among the other eligible
  replicas (a spill, counted in `spills`); with no other, back to the primary.
  A model without a primary: least-loaded among all eligible.
- `StaticEfficientPolicy()`: pools ranked once by modeled joules per output
  token at a reference batch; the most efficient pool with room takes the
  request (energy.py).
- `EnergyAwarePolicy(max_load_per_replica=8, hysteresis=0.1, carbon=())`:
  lowest marginal joules (or gCO2) per token of one more sequence, with
  per-model pool hysteresis (energy.py).
- `HintAdmission(mode="hint", kv_headroom=1.0, default_max_tokens=4096,
  chooser=None, max_queue=0)`: admission by predicted KV need. The estimate:
  mode "hint": `hint_p90` (a forecast of total tokens, prompt included; NaN ->
  the conservative rule); "perfect": prompt + the true completion tokens (the
  oracle bound, for comparison only); "none": prompt + default_max_tokens (the
  cap reserved whole: the conservative baseline; the Workload has no per-request
  max_tokens, so the default cap is used for every request). need = the
  estimate rounded up to the replica's KV blocks. Admit when some eligible
  replica has free KV kv_capacity * kv_headroom - kv_used >= need, or a short
  queue (queued <= max_queue: the request would be next in line); else reject
  with reason "kv_forecast". With no eligible replica it admits and lets the
  simulator answer `no_replica`. `choose` hands `chooser` (default LeastLoaded)
  the eligible replicas whose free KV covers the need, or all of them when none
  does.
"""

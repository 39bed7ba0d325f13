"""The fleet simulator (docs/design/fleet.md): discrete-event GPU replica pools with continuous
batching, request-conserving.

    simulator.py   FleetSim and the run loop          arrivals.py  arrivals, rejections, aborts
    fleet.py       pool and simulator config, replica state
    views.py       the request cursor, the fleet view, replica scaling
    policy.py      what a policy and a controller see and answer (the protocols)
    result.py      one run's SimResult                workload.py  ledger or synthetic Workload
    outcomes.py    the per-policy summary of a run    saturation.py  capacity measured on it
    queueing.py    M/G/c formulas that cross-check it
"""

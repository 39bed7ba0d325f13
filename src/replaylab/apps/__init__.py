"""What the three entry points (`python -m training`, `python -m export`,
`python -m evaluation`) share: run recording in MLflow, provenance (git commit,
signing key), the demand run state, and the glue from a composed Hydra config to
one library call per pipeline or experiment.

This is the only place under `src/` that calls MLflow or reads environment
variables; the library below it stays pure. Nothing runs at import.
"""

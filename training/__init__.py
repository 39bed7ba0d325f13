"""`python -m training`: the thin Hydra entry point of every pipeline."""

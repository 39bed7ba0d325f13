"""Report rendering (pure; no MLflow)."""

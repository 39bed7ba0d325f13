"""`python -m export`: ONNX + manifest from a finished run (arrives with the artifacts issue, #4)."""

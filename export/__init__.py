"""`python -m export`: the demand artifact (ONNX + manifest) of a finished run; shared glue."""

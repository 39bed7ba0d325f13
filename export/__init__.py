"""`python -m export`: the artifact (demand or router, manifest-verified) of a finished run;
the Model Registry actions."""

"""`python -m evaluation`: calibration, OPE, go/no-go and fleet experiments (arrive with issues #3-#6)."""

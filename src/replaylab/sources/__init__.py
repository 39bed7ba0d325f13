"""Importers of public traces and outcome sets, and the seeded synthetic ledger."""

"""Demand hints offline: replay a ledger through the runtime, aggregate residuals and drift."""

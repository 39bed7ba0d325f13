"""Routing: a MiniLM cost/quality router learned from session-scoped exploration."""

"""Replica telemetry: the simulator's modeled feed and the wrapper that routes on it
(feed.py), and the Prometheus adapters that build observations from real engines
(adapters/; docs/specs/telemetry.md). The observation-v1 contract they produce is
`replaylab.contracts.observation`.
"""

"""replaylab: models that sit around an LLM serving fleet, learned from replay ledgers.

The library is pure: importing it does no I/O and reads no environment.
"""

__version__ = "0.1.0"

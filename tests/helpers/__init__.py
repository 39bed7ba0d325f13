"""Plain functions and constants the test modules share (fixtures live in conftest.py or
the test modules). Test modules import from here, never from each other."""

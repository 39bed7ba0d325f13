"""Data shipped with the package (found with importlib.resources, never by path arithmetic)."""

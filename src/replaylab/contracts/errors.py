"""The one base class of the errors that are a bad input, not a bug.

Each of them subclasses `InputError` (and keeps its own built-in base: most are
ValueErrors, `ManifestError` is a plain Exception, `StageFailed` a RuntimeError),
so the entry points catch one class: an `InputError` becomes one `error: ...` line
on stderr and exit code 2 (`replaylab.apps.recording.run_recorded`); anything else
keeps its traceback. Standard library only: the serving runtime imports it too.
"""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(Exception):
    """A bad input or config (a file, a frame, a setting, an artifact), not a bug: the
    message says what is wrong in one line."""

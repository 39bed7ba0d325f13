"""Matplotlib for report figures: the file-only backend, saving a figure, shared colours.

Matplotlib is imported on the first call of :func:`pyplot`, not when this module
is imported, so importing a report module stays cheap and changes no backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

GOOD, BAD, GREY = "#1f5fa8", "#c0392b", "#c8c8c8"
"""The reports' ink: the model or a pass (blue), a miss (red), too few rows to judge (grey)."""


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (PNG files only, no screen)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, plt: Any, path: Path, dpi: int = 110) -> Path:
    """Write fig as PNG at dpi (tight layout) into a folder made if needed; close it.

    ``plt`` is what :func:`pyplot` returned. Returns path as a Path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path

"""One helper for a package's lazily imported names (standard library only).

    __getattr__, __dir__ = lazy_exports(__name__, {"Name": ".module", ...})

`from package import Name` and `package.Name` import the module on first use and
keep the value on the package; nothing is imported when the package is. A module
name with a leading dot is relative to the package; any other is absolute. It lives
in contracts/ so the serving runtime can use it (runtime/ imports only runtime/ and
contracts/).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, names: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of `package` that import each of
    `names` (name -> the module defining it) on first access."""
    table = dict(names)

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__

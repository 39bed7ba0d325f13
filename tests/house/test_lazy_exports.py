"""`replaylab.contracts.lazy.lazy_exports`: the one helper behind the packages' lazily
imported names (`from replaylab.demand import QuantileDemandModel` loads lightgbm only then)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

from replaylab.contracts.lazy import lazy_exports

PACKAGES = ("replaylab.contracts", "replaylab.runtime", "replaylab.artifacts",
            "replaylab.projection", "replaylab.forecast", "replaylab.demand")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves(package):
    pkg = importlib.import_module(package)
    assert set(pkg.__all__) <= set(dir(pkg))
    for name in pkg.__all__:
        assert getattr(pkg, name) is not None, (package, name)
        exec(f"from {package} import {name}", {})  # noqa: S102
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        pkg.no_such_name  # noqa: B018


def test_importing_the_packages_loads_no_heavy_library():
    heavy = ("dask", "distributed", "lightgbm", "statsforecast", "onnx", "onnxruntime",
             "sklearn", "torch", "mlflow")
    code = (f"import sys\nfor p in {PACKAGES!r}: __import__(p)\n"
            f"print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_the_helper_caches_on_the_package_and_lists_the_names(monkeypatch):
    pkg = types.ModuleType("fake_pkg")
    monkeypatch.setitem(sys.modules, "fake_pkg", pkg)
    pkg.__getattr__, pkg.__dir__ = lazy_exports("fake_pkg", {"sqrt": "math",
                                                             "dumps": "json"})
    assert pkg.sqrt(4.0) == 2.0 and "sqrt" in vars(pkg)  # kept after the first access
    assert {"sqrt", "dumps"} <= set(pkg.__dir__())
    with pytest.raises(AttributeError, match="module 'fake_pkg' has no attribute 'x'"):
        pkg.__getattr__("x")

"""The Go host (scorers/go: cgo over libreplaylab_scorer.a, docs/specs/c-abi.md).

`go test` there loads the committed fixture artifacts through the C ABI and checks the
demand and router golden vectors, routing on the host's embedding of a MiniLM-tier
fixture's golden triples (when one is committed), the golden binder sessions byte for
byte (the Python runtime's records), and the same answers from 8 goroutines. Built
offline (no module dependencies). Skipped with one line when `go` (Debian's golang-go,
`make test` installs it) or cargo is absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.helpers.rust import CRATE, build_library, cargo_or_skip

MODULE = CRATE.parent / "go"


def test_go_test_passes_on_the_fixtures():
    go = shutil.which("go")
    if go is None:
        pytest.skip("go not on PATH (apt-get install golang-go): the Go host is not checked")
    build_library(cargo_or_skip())
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off", "CGO_ENABLED": "1"}
    proc = subprocess.run([go, "test", "-count=1", "-v", "./..."], cwd=MODULE, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("TestDemandGoldenVectors", "TestRouterGoldenVectors",
                 "TestGoldenSessionsByteForByte", "TestBinderFromGoroutines"):
        assert f"--- PASS: {name}" in proc.stdout, name
    embedding = [x for x in proc.stdout.splitlines() if "TestRouteByEmbedding" in x and "---" in x]
    print(embedding[0].strip() if embedding else "TestRouteByEmbedding: not run")

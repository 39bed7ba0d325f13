"""The reviewer's walkthrough of docs/howto/mlflow.md, run from the page itself.

Every line of the page's "Walkthrough" code blocks that ends in `# exit N` is a command
of the walkthrough (a `\\`-continued line is one command); the slow test runs them in
the page's order against a real `mlflow server` on loopback, from a fresh folder and a
fresh store, and asserts each exit code the page states. The page and the test cannot
drift: a command added to the page is run, one removed is no longer run, a wrong exit
code fails. The fast tests check the page still holds what the issue asks for (a GO per
kind on the shipped data, a refused promote) and that the shipped receipts ledger is the
one `scripts/walkthrough_data.py` builds.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, mlflow_server_process

DOC = REPO / "docs" / "howto" / "mlflow.md"
COMMAND = re.compile(r"^(?P<cmd>.*?)\s+#\s*exit (?P<code>\d+)\b")


def walkthrough_commands(text: str) -> list[tuple[str, int]]:
    """(command, exit code) of every `# exit N` line of the page's Walkthrough blocks."""
    section = text.split("\n## Walkthrough", 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            m = COMMAND.match(line.strip())
            if m:
                out.append((m["cmd"].strip(), int(m["code"])))
    return out


def argv(cmd: str) -> list[str]:
    """A page command as the test runs it: `python` is this interpreter."""
    words = shlex.split(cmd)
    assert words[0] == "python", f"a walkthrough command starts with python: {cmd}"
    return [sys.executable, *words[1:]]


def test_the_walkthrough_holds_a_go_per_kind_and_a_refusal():
    steps = walkthrough_commands(DOC.read_text())
    assert len(steps) >= 10, steps
    joined = {cmd: code for cmd, code in steps}

    def has(code: int, *words: str) -> bool:
        return any(c == code and all(w in cmd for w in words) for cmd, c in joined.items())

    # a GO per kind on shipped data, each promoted (the test below asserts the GO itself)
    assert has(0, "pipeline=demand", "data=walkthrough_demand")
    assert has(0, "pipeline=router", "data=walkthrough_receipts")
    assert has(0, "promote", "name=replaylab-demand", "alias=champion")
    assert has(0, "promote", "name=replaylab-router", "alias=champion")
    assert has(0, "fetch", "name=replaylab-demand") and has(0, "fetch", "name=replaylab-router")
    assert has(0, "compare", "name=replaylab-demand")
    assert has(3, "promote", "name=replaylab-demand")  # the NO-GO challenger, refused
    # every version a command names is one the walkthrough trains before it
    trained = {"replaylab-demand": 0, "replaylab-router": 0}
    for cmd, _ in steps:
        if "python -m training" in cmd:
            trained["replaylab-router" if "pipeline=router" in cmd else "replaylab-demand"] += 1
        m = re.search(r"name=(\S+) version=(\d+)", cmd)
        if m:
            assert int(m[2]) <= trained[m[1]], f"{cmd}: version {m[2]} is never trained"


def test_the_shipped_receipts_are_the_ones_the_script_builds():
    proc = subprocess.run([sys.executable, "scripts/walkthrough_data.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]


@pytest.mark.integration
@pytest.mark.slow
def test_the_walkthrough_runs_as_written_against_a_real_server(tmp_path):
    from mlflow.tracking import MlflowClient

    steps = walkthrough_commands(DOC.read_text())
    work = tmp_path / "work"
    work.mkdir()
    # the encoder and embedding caches of the checkout (a fresh clone builds them once)
    (REPO / "outputs" / "cache").mkdir(parents=True, exist_ok=True)
    (work / "outputs").mkdir()
    (work / "outputs" / "cache").symlink_to(REPO / "outputs" / "cache")
    with mlflow_server_process(tmp_path) as (url, _pid):
        env = {**os.environ, "MLFLOW_TRACKING_URI": url,
               "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                             if p),
               # the project's signing key: a file made on first use, here in tmp
               "REPLAYLAB_HMAC_KEY_FILE": str(tmp_path / "replaylab-hmac.key"),
               # OpenMP threads sleep instead of spinning while they wait: on a busy
               # machine LightGBM's and torch's two spinning threads made a 2-minute
               # demand run take over 15 (same results: only the waiting changes)
               "OMP_WAIT_POLICY": "PASSIVE"}
        env.pop("REPLAYLAB_HMAC_KEY", None)
        log = []
        for cmd, code in steps:
            t0 = time.monotonic()
            proc = subprocess.run(argv(cmd), cwd=work, env=env, capture_output=True, text=True,
                                  timeout=1800)
            last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
            log.append(f"exit {proc.returncode} (page: {code}) in {time.monotonic() - t0:.1f} s: "
                       f"{cmd}\n    {last[0][:300]}")
            (tmp_path / "walkthrough.log").write_text("\n".join(log) + "\n")  # as it goes
            assert proc.returncode == code, "\n".join(log) + "\n" + proc.stderr[-3000:]

        # the runs the page calls GO are GO, and what they registered is served
        summaries = {p.parent.name: json.loads(p.read_text())
                     for p in (work / "outputs" / "walkthrough").glob("*/summary.json")}
        go = {name: s.get("go", (s.get("gate") or {}).get("go")) for name, s in summaries.items()}
        assert go.get("demand-go") is True and go.get("router-go") is True, go
        assert go.get("demand-default") is False, go
        client = MlflowClient(tracking_uri=url)
        assert client.get_model_version_by_alias("replaylab-demand", "champion").version == "1"
        assert client.get_model_version_by_alias("replaylab-router", "champion").version == "1"
        served = json.loads((work / "serve" / "demand" / "manifest.json").read_text())
        assert served["training"]["mlflow_run_id"] == summaries["demand-go"]["mlflow"]["run_id"]
        assert (work / "serve" / "router" / "router.json").is_file()

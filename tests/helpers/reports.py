"""Fake demand runs, an HTML parser, and headless Chromium over the DevTools pipe (the
report tests)."""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest

PREDICTORS = ["model", "prompt_length", "max_tokens_cap", "category_bucket", "session_ewma"]


QS = (0.1, 0.5, 0.9)


Z = {0.1: -1.2816, 0.5: 0.0, 0.9: 1.2816}


FINGERPRINT = "f00dfacec0ffee1234567890abcdef"


def fake_predictions(n: int = 3000, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    cats = rng.choice(["code", "chat", "summarize", "rare"], n, p=[0.4, 0.37, 0.19, 0.04])
    models = rng.choice(["gpt-a", "gpt-b", "small-c"], n, p=[0.5, 0.35, 0.15])
    slo = rng.choice(["interactive", "batch"], n, p=[0.7, 0.3])
    cat_mu = pd.Series(cats).map({"code": 6.4, "chat": 5.2, "summarize": 5.8, "rare": 7.0})
    mu = cat_mu.to_numpy() + rng.normal(0, 0.6, n)          # what the model can see
    y = np.exp(mu + rng.normal(0, 0.7, n))
    df = pd.DataFrame({"request_id": [f"r{i:05d}" for i in range(n)], "selected_model": models,
                       "category": cats, "slo_class": slo})
    spread = {  # (centre, log sd) per predictor
        "model": (mu, 0.7), "prompt_length": (np.full(n, 5.9), 1.1),
        "category_bucket": (cat_mu.to_numpy(), 0.92), "session_ewma": (mu + 0.2, 0.6)}
    for p, (centre, sd) in spread.items():
        for t in QS:
            df[f"{p}-q{t}"] = np.exp(centre + sd * Z[t])
    df["model-q0.1"] *= 0.4  # a biased low quantile: the session EWMA beats it there
    for t in QS:
        df[f"max_tokens_cap-q{t}"] = 4096.0
    for p in PREDICTORS:
        df[f"{p}-lo-80"] = df[f"{p}-q0.1"]
        df[f"{p}-hi-80"] = df[f"{p}-q0.9"]
    df["model-lo-80"] = np.exp(mu + 0.71 * Z[0.1])  # calibrated interval
    df["model-hi-80"] = np.exp(mu + 0.71 * Z[0.9])
    censored = rng.random(n) < 0.05
    absent = ~censored & (rng.random(n) < 0.03)
    df["y"] = np.where(absent, np.nan, np.where(censored, y * 0.5, y))
    df["censored"], df["absent_usage"] = censored, absent
    return df


def _scores(sub: pd.DataFrame, p: str) -> dict:
    y = sub["y"].to_numpy()
    pin = {}
    for t in QS:
        d = y - sub[f"{p}-q{t}"].to_numpy()
        pin[str(t)] = float(np.mean(np.maximum(t * d, (t - 1) * d)))
    lo, hi = sub[f"{p}-lo-80"].to_numpy(), sub[f"{p}-hi-80"].to_numpy()
    return {"pinball": pin, "mean_pinball": float(np.mean(list(pin.values()))),
            "coverage": float(np.mean((y >= lo) & (y <= hi))),
            "mean_width": float(np.mean(hi - lo)),
            "mae_p50": float(np.mean(np.abs(y - sub[f"{p}-q0.5"].to_numpy())))}


def fake_summary(pred: pd.DataFrame) -> dict:
    ev = pred[pred["y"].notna() & ~pred["censored"] & ~pred["absent_usage"]]
    model = _scores(ev, "model")
    groups = [{"by": by, "value": v, "n": len(sub), "coverage": _scores(sub, "model")["coverage"],
               "pinball": _scores(sub, "model")["pinball"]}
              for by in ("selected_model", "category", "slo_class")
              for v, sub in ev.groupby(by)]
    cens = pred[pred["censored"]]
    nominal = [0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    return {
        "pipeline": "demand", "rows_read": 20_400, "rows_valid": 20_000, "rows_quarantined": 400,
        "quarantine_by_reason": {"bad_timestamp": 300, "negative_tokens": 100},
        "labels": {"train": 14_000, "calibration": 3_000, "test": len(pred),
                   "censored": 1_000, "absent_usage": 600},
        "interval": 0.8, "projection": {"version": "projection-v1"},
        "ledger_fingerprint": FINGERPRINT,
        "test": {"model": model,
                 "baselines": {p: _scores(ev, p) for p in PREDICTORS[1:]},
                 "groups": groups,
                 "reliability": [{"nominal": x, "observed": model["coverage"] if x == 0.8
                                  else x - 0.02 + 0.01 * i} for i, x in enumerate(nominal)],
                 "censored": {"n": len(cens), "hi_at_least_observed":
                              float(np.mean(cens["model-hi-80"] >= cens["y"]))}},
    }


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.headings: list[str] = []
        self.imgs: list[dict] = []
        self.text: list[str] = []
        self.scripts = 0
        self._h = None

    def handle_starttag(self, tag, attrs):
        if tag in ("h1", "h2", "h3"):
            self._h = []
        elif tag == "img":
            self.imgs.append(dict(attrs))
        elif tag == "script":
            self.scripts += 1

    def handle_endtag(self, tag):
        if tag in ("h1", "h2", "h3") and self._h is not None:
            self.headings.append("".join(self._h).strip())
            self._h = None

    def handle_data(self, data):
        self.text.append(data)
        if self._h is not None:
            self._h.append(data)


def parse_page(markup: str) -> Page:
    page = Page()
    page.feed(markup)
    return page


# Chromium's own stderr noise in this container (no dbus, no GPU, no network): ignored.
IGNORED_STDERR = [
    r"dbus/",                  # no system bus in the container
    r"bluez|Floss|UPower",     # bluetooth / power services over dbus
    r"vaapi|drmGetDevices|gpu|viz|angle|egl|GL_|gl_",  # no GPU
    r"sandbox",                # --no-sandbox as root
    r"idle_linux|ScreenSaver",  # screensaver services over dbus
    r"/usr/bin/chromium: ",    # the Debian launcher's shell warnings (/etc/chromium.d)
    r"DevTools listening",     # informational
    r"fontconfig|Fontconfig",
]


def _chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists(
        "/usr/bin/chromium") else None)
    if path is None:
        pytest.skip("headless Chromium not found at /usr/bin/chromium; `make test` installs "
                    "Debian's chromium package when missing (apt-get install -y chromium)")
    return path


def _flags(profile: str) -> list[str]:
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--hide-scrollbars", f"--user-data-dir={profile}"]


def dump_dom(url: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([_chromium(), *_flags(profile), "--dump-dom", url],
                              capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


class _Cdp:
    """DevTools protocol over --remote-debugging-pipe (Chromium reads fd 3, writes fd 4)."""

    def __init__(self, proc, wfd: int, rfd: int):
        self.proc, self.wfd, self.rfd = proc, wfd, rfd
        self.buf, self.events, self.next_id = b"", [], 0

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.wfd, json.dumps(msg).encode() + b"\0")
        want = self.next_id
        reply = self.wait(lambda m: m.get("id") == want, timeout)
        assert "error" not in reply, f"{method}: {reply['error']}"
        return reply.get("result", {})

    def wait(self, match, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "method" in msg:
                    self.events.append(msg)
                if match(msg):
                    return msg
            left = deadline - time.monotonic()
            assert left > 0, "timed out waiting for Chromium"
            ready, _, _ = select.select([self.rfd], [], [], left)
            if ready:
                chunk = os.read(self.rfd, 1 << 20)
                assert chunk, "Chromium closed the DevTools pipe"
                self.buf += chunk


_PROBE = """
Promise.all(Array.from(document.images).map(i => i.decode().catch(() => null))).then(() =>
  JSON.stringify(Array.from(document.images).map(i => {
    const r = i.getBoundingClientRect();
    return {alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight,
            x: r.left + scrollX, y: r.top + scrollY, cw: r.width, ch: r.height};
  })))
"""


def browse(url: str, width: int = 1280) -> dict:
    """Load url; return console/exception/log events, image probes, a full-page PNG, stderr."""
    to_chrome_r, to_chrome_w = os.pipe()
    from_chrome_r, from_chrome_w = os.pipe()

    def child_fds():  # runs in the child: its fd 3 reads commands, fd 4 writes replies
        a = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
        b = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
        os.dup2(a, 3)
        os.dup2(b, 4)

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    stderr = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [_chromium(), *_flags(profile), "--remote-debugging-pipe", "--enable-logging=stderr",
         "--v=0", "about:blank"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=stderr, preexec_fn=child_fds, pass_fds=(3, 4), start_new_session=True)
    os.close(to_chrome_r)
    os.close(from_chrome_w)
    cdp = _Cdp(proc, to_chrome_w, from_chrome_r)
    try:
        target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            cdp.send(f"{domain}.enable", session=sid)
        cdp.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900,
                 "deviceScaleFactor": 1, "mobile": False}, session=sid)
        cdp.send("Page.navigate", {"url": url}, session=sid)
        loaded = f"location.href === {json.dumps(url)} && document.readyState === 'complete'"
        deadline = time.monotonic() + 90
        while not cdp.send("Runtime.evaluate", {"expression": loaded, "returnByValue": True},
                           session=sid)["result"].get("value"):
            assert time.monotonic() < deadline, f"{url} did not finish loading"
            time.sleep(0.1)
        probe = cdp.send("Runtime.evaluate", {"expression": _PROBE, "awaitPromise": True,
                         "returnByValue": True}, session=sid)["result"]["value"]
        height = cdp.send("Runtime.evaluate", {
            "expression": "document.documentElement.scrollHeight", "returnByValue": True},
            session=sid)["result"]["value"]
        cdp.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": int(height),
                 "deviceScaleFactor": 1, "mobile": False}, session=sid)
        shot = cdp.send("Page.captureScreenshot", {"format": "png"}, session=sid)["data"]
        time.sleep(0.3)  # let late console events arrive
        cdp.send("Runtime.evaluate", {"expression": "1"}, session=sid)
        try:
            cdp.send("Browser.close", timeout=10)
        except AssertionError:
            pass  # the pipe closes as the browser exits
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # our own process group only
            proc.wait(timeout=10)
        os.close(to_chrome_w)
        os.close(from_chrome_r)
        shutil.rmtree(profile, ignore_errors=True)
        stderr.seek(0)
        err = stderr.read().decode(errors="replace")
        stderr.close()
    ev = cdp.events
    return {
        "console_errors": [e["params"] for e in ev if e["method"] == "Runtime.consoleAPICalled"
                           and e["params"]["type"] in ("error", "assert")],
        "console_all": [e["params"] for e in ev if e["method"] == "Runtime.consoleAPICalled"],
        "exceptions": [e["params"]["exceptionDetails"] for e in ev
                       if e["method"] == "Runtime.exceptionThrown"],
        "log_errors": [e["params"]["entry"] for e in ev if e["method"] == "Log.entryAdded"
                       and e["params"]["entry"]["level"] == "error"],
        "images": json.loads(probe), "png": base64.b64decode(shot), "stderr": err,
    }


def page_stderr_problems(stderr: str, url: str) -> tuple[list[str], list[str]]:
    """(lines from the page: console messages, uncaught errors; unknown other ERROR lines)."""
    page, other = [], []
    for line in stderr.splitlines():
        if ":CONSOLE" in line or "Uncaught" in line or url in line:
            page.append(line)
        elif "ERROR:" in line and not any(re.search(p, line) for p in IGNORED_STDERR):
            other.append(line)
    return page, other


def ink(png: bytes, box: tuple[int, int, int, int]) -> float:
    """Share of non-white pixels inside box (x, y, w, h) of the screenshot."""
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    x, y, w, h = box
    crop = img[y:y + h, x:x + w]
    return float(np.mean(crop.min(axis=2) < 225)) if crop.size else 0.0

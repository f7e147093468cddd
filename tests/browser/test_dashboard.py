"""Browser test of the built-in dashboard, run by scripts/test-dashboard.

Starts the real `dpledger serve`, trains a 200-example run over HTTP with 100 steps
and 105 DP releases (one population release per step, a per-group release every 20
steps), then drives headless Chromium (Debian's chromium + chromedriver, through
Selenium) through /dashboard with admin, curator, viewer and owner tokens, and with
a malformed, a forged and an expired token. Screenshots go to docs/.
"""

import base64
import hashlib
import hmac
import json
import os
import queue
import random
import re
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parents[2]
# Screenshots go under target/ so a test run leaves the tree clean; set
# DPLEDGER_SCREENSHOT_DIR=docs to refresh the images the docs show.
SHOTS = Path(os.environ.get("DPLEDGER_SCREENSHOT_DIR", ROOT / "target" / "dashboard-screenshots"))
if not SHOTS.is_absolute():
    SHOTS = ROOT / SHOTS
N = 200
STEPS = 100
REFRESH_EVERY = 10  # the public schedule: a full pass of norms every 10 steps
LEVELS = [0.1, 0.3, 0.5, 0.7, 0.9]
OWNED = 6  # an easy example: its epsilon is well below the worst case


def fmt(x):
    """The page's number format (app.js `fmt`)."""
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e6:
        s = f"{float(f'{x:.4g}'):.10g}"
        return s
    m, e = f"{x:.3e}".split("e")
    return f"{m}e{int(e)}"


class Server:
    def __init__(self, data_dir: Path):
        binary = os.environ.get("DPLEDGER_BIN", str(ROOT / "target/release/dpledger"))
        self.bin = binary
        self.data_dir = data_dir
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "DPLEDGER_LOG": "warn"},
        )
        lines = queue.Queue()
        threading.Thread(target=lambda: lines.put(self.proc.stdout.readline()), daemon=True).start()
        line = lines.get(timeout=60).decode().strip()
        assert line.startswith("dpledger listening on "), line
        self.url = line[len("dpledger listening on ") :]
        self.admin = (data_dir / "admin.token").read_text().strip()

    def token(self, role, dataset=None, examples=None):
        cmd = [self.bin, "token", "--role", role, "--data-dir", str(self.data_dir)]
        if dataset:
            cmd += ["--dataset", dataset]
        if examples:
            cmd += ["--examples", ",".join(map(str, examples))]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()

    def call(self, method, path, token, body=None):
        req = urllib.request.Request(
            self.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def ok(self, method, path, token, body=None):
        status, out = self.call(method, path, token, body)
        assert 200 <= status < 300, (method, path, status, out)
        return out

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def release(srv, by_group=False):
    body = {"mean": {"rho": 1e-4}, "quantiles": {"rho": 1e-4, "levels": LEVELS}}
    if by_group:
        # Per-group DP counts of 100 need more than rho 1e-4 (noise sd ~70 would
        # clamp a group's count to 0 now and then, and the page rightly hides the
        # disparity line when fewer than two groups have a positive count).
        body = {"mean": {"rho": 0.01}, "quantiles": {"rho": 0.01, "levels": LEVELS}, "by_group": True}
    else:
        body["histogram"] = {"rho": 1e-4, "bins": 12}
    return srv.ok("POST", "/v1/datasets/run1/releases", srv.admin, body)


def norm(i, rng):
    # Even ids are easy (small gradients, clipped low), odd ids hard (always at C).
    return rng.uniform(0.05, 0.4) if i % 2 == 0 else 3.0


def step(srv, t, rng):
    if t % REFRESH_EVERY == 0:
        # The scheduled full pass: every example's norm at the current model.
        srv.ok("POST", "/v1/datasets/run1/refresh", srv.admin, {"ids": list(range(N)), "norms": [norm(i, rng) for i in range(N)]})
    ids = [i for i in range(N) if rng.random() < 0.1]
    norms = [norm(i, rng) for i in ids]
    srv.ok("POST", "/v1/datasets/run1/steps", srv.admin, {"step": t, "ids": ids, "norms": norms})


@pytest.fixture(scope="module")
def run():
    tmp = Path(tempfile.mkdtemp(prefix="dpledger-dash-"))
    srv = Server(tmp)
    srv.ok(
        "POST",
        "/v1/datasets",
        srv.admin,
        {
            "id": "run1",
            "config": {
                "examples": N,
                "max_grad_norm": 1.0,
                "noise_multiplier": 1.1,
                "sampling": {"kind": "poisson", "rate": 0.1},
                "delta": 1e-5,
                "refresh": {"full_every": REFRESH_EVERY},
            },
            "labels": ["easy" if i % 2 == 0 else "hard" for i in range(N)],
        },
    )
    srv.ok("PUT", "/v1/datasets/run1/release-budget", srv.admin, {"rho": 1.0})
    rng = random.Random(17)
    for t in range(STEPS):
        step(srv, t, rng)
        release(srv)
        if (t + 1) % 20 == 0:
            release(srv, by_group=True)
    srv.rng = rng
    yield srv
    srv.stop()


def snapshot(srv):
    """What the API says, read with the admin token."""
    worst = srv.ok("GET", "/v1/datasets/run1/worst-case", srv.admin)
    rel = srv.ok("GET", "/v1/datasets/run1/releases?limit=1000", srv.admin)
    # The per-example value the page shows beside the guarantee: the ex-post bound.
    eps = [srv.ok("GET", f"/v1/datasets/run1/examples/{i}/privacy", srv.admin)["example"]["ex_post"]["epsilon"] for i in range(N)]
    return worst, rel, eps


def browser():
    opts = webdriver.ChromeOptions()
    for a in [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
        f"--user-data-dir={tempfile.mkdtemp(prefix='dpledger-chromium-')}",
    ]:
        opts.add_argument(a)
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(options=opts, service=service)


@pytest.fixture()
def driver():
    d = browser()
    yield d
    d.quit()


def open_with(driver, srv, token, query=""):
    driver.get(srv.url + "/dashboard" + query)
    WebDriverWait(driver, 20).until(lambda d: d.execute_script("return document.body.dataset.state") == "login")
    driver.find_element(By.ID, "token-input").send_keys(token)
    driver.find_element(By.ID, "token-submit").click()


def wait_ready(driver, curator=False):
    WebDriverWait(driver, 60).until(
        lambda d: d.execute_script(
            "const s = window.dpDashboard; return document.body.dataset.state === 'ready' && s.firstRenderMs !== null"
            + (" && s.exactRenderMs !== null" if curator else "")
        )
    )


def console_errors(driver, allow=None):
    logs = driver.get_log("browser")
    return [e for e in logs if e["level"] == "SEVERE" and not (allow and re.search(allow, e["message"]))]


def chart_data(driver, name):
    return driver.execute_script(
        "const c = window.dpDashboard.charts[arguments[0]]; if (!c) return null;"
        "const cv = c.root.querySelector('canvas');"
        "return {data: c.data, w: cv.width, h: cv.height};",
        name,
    )


def screenshot(driver, name):
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(max(height, 800), 6000))
    time.sleep(0.3)
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"dashboard-{name}.png"))


def fetched_urls(driver):
    return driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")


def close(a, b):
    return abs(a - b) <= 1e-12 * max(1.0, abs(a), abs(b))


def check_common(driver, srv, snap):
    worst, rel, _ = snap
    assert close(float(driver.find_element(By.ID, "worst-eps").text), float(fmt(worst["epsilon"])))
    # One headline tile (the tightest proven worst case, naming its method), the
    # RDP figure beside it; no second tile repeating the same number.
    assert driver.find_element(By.ID, "worst-rdp").text == "RDP " + fmt(worst["rdp"]["epsilon"])
    assert ("by " + worst["method"].upper()) in driver.find_element(By.ID, "worst-detail").text
    headlines = [h.text for h in driver.find_elements(By.CSS_SELECTOR, ".stat h3")]
    assert sum("Worst-case epsilon" in h for h in headlines) == 1, headlines
    # Every request went to this server; none to another host.
    for u in fetched_urls(driver):
        assert u.startswith(srv.url + "/"), u
    # Worst case over steps: each release's bound at its step, then the current value.
    w = chart_data(driver, "worst")
    assert w and w["w"] > 0 and w["h"] > 0
    xs, ys = w["data"]
    got = dict(zip(xs, ys))
    assert close(got[worst["steps"]], worst["epsilon"])
    for r in sorted(rel["releases"], key=lambda r: -r["id"]):  # the first of a step wins
        first = min(x["id"] for x in rel["releases"] if x["step"] == r["step"])
        if r["step"] != worst["steps"] and r["id"] == first:
            assert close(got[r["step"]], r["bound"]), r["id"]
    assert xs == sorted(xs)
    # DP releases over time: steps, means and every quantile level, as released.
    pop = sorted((r for r in rel["releases"] if r["values"].get("population")), key=lambda r: r["id"])
    assert len(pop) == STEPS
    c = chart_data(driver, "releases")
    assert c["w"] > 0 and c["h"] > 0
    data = c["data"]
    assert data[0] == [r["step"] for r in pop]
    assert all(close(a, r["values"]["population"]["mean"]["mean"]) for a, r in zip(data[1], pop))
    for k, level in enumerate(LEVELS):
        want = [next(q["value"] for q in r["values"]["population"]["quantiles"] if q["level"] == level) for r in pop]
        assert all(close(a, b) for a, b in zip(data[2 + k], want)), level
    # The latest DP histogram.
    h = chart_data(driver, "histogram")
    assert h["data"][1] == pop[-1]["values"]["population"]["histogram"]["counts"]
    # Per-group comparison of the latest per-group release.
    g = chart_data(driver, "groups")
    grp = sorted((r for r in rel["releases"] if r["values"].get("groups")), key=lambda r: r["id"])
    assert g["data"][0] == [r["step"] for r in grp]
    groups_text = driver.find_element(By.ID, "groups").text
    for gr in grp[-1]["values"]["groups"]:
        assert fmt(gr["mean"]["mean"]) in groups_text
    # The disparity line appears exactly when two or more groups have a positive DP count.
    counted = [gr for gr in grp[-1]["values"]["groups"] if gr.get("mean") and gr["mean"]["count"] > 0]
    assert ("Disparity between groups" in groups_text) == (len(counted) >= 2), groups_text
    assert len(counted) >= 2, "both labelled groups (100 examples each) should have a positive DP count"
    # Budget.
    budget = driver.find_element(By.ID, "budget").text
    assert fmt(rel["budget"]["rho_spent"]) in budget and fmt(rel["budget"]["rho_budget"]) in budget


def check_no_other_epsilons(driver, snap, allowed_ids):
    worst, rel, eps = snap
    text = driver.find_element(By.TAG_NAME, "body").text
    state = driver.execute_script("return JSON.stringify(window.dpDashboard.data)")
    public = {fmt(worst["epsilon"])} | {fmt(eps[i]) for i in allowed_ids}
    # DP quantiles land next to some example's value by design: what was released
    # is public, so only values that match nothing released are checked.
    for r in rel["releases"]:
        public.add(fmt(r["bound"]))
        for st in [r["values"].get("population")] + (r["values"].get("groups") or []):
            if st:
                public |= {fmt(q["value"]) for q in st.get("quantiles") or []}
                if st.get("mean"):
                    public.add(fmt(st["mean"]["mean"]))
    checked = 0
    for i, e in enumerate(eps):
        if i in allowed_ids or fmt(e) in public:
            continue
        if re.fullmatch(r"\d+", fmt(e)):
            # Shown as a whole number (3), it would match any count on the page;
            # the page's data must still not hold it.
            assert repr(e) not in state, f"example {i}'s epsilon is in the page's data"
            continue
        checked += 1
        # A whole number on the page, not a prefix of a longer one (a DP value
        # shown as 3.439 is not example i's 3.43).
        shown = re.search(r"(?<![\d.])" + re.escape(fmt(e)) + r"(?!\d)", text)
        assert shown is None, f"example {i}'s epsilon {fmt(e)} is on the page"
        assert repr(e) not in state, f"example {i}'s epsilon is in the page's data"
    assert checked >= N // 3  # the easy examples differ from the worst case
    for u in fetched_urls(driver):
        m = re.search(r"/examples/(\d+)/privacy", u)
        assert not m or int(m.group(1)) in allowed_ids, u


def test_admin_and_curator(run, driver):
    snap = snapshot(run)
    worst, _, eps = snap
    for role, token in [("admin", run.admin), ("curator", run.token("curator", "run1"))]:
        open_with(driver, run, token)
        wait_ready(driver, curator=True)
        check_common(driver, run, snap)
        exact = driver.execute_script("return window.dpDashboard.data.exact")
        assert exact["epsilons"] == eps
        at_worst = [i for i, e in enumerate(eps) if e >= worst["epsilon"] * (1 - 1e-9)]
        assert exact["atWorst"] == at_worst and len(at_worst) >= N // 3
        assert exact["retired"] == []
        assert sum(chart_data(driver, "exact")["data"][1]) == N
        assert fmt(min(eps)) in driver.find_element(By.ID, "exact-summary").text
        assert "noise multiplier" in driver.find_element(By.ID, "config").text
        assert console_errors(driver) == []
        ms = driver.execute_script("return [window.dpDashboard.firstRenderMs, window.dpDashboard.exactRenderMs]")
        print(f"\n{role}: charts {ms[0]:.0f} ms, exact distribution of {N} examples {ms[1]:.0f} ms after navigation start (incl. typing the token)")
        screenshot(driver, role)
        driver.find_element(By.ID, "forget").click()
        assert driver.execute_script("return sessionStorage.length") == 0


def test_viewer(run, driver):
    snap = snapshot(run)
    open_with(driver, run, run.token("viewer", "run1"))
    wait_ready(driver)
    check_common(driver, run, snap)
    check_no_other_epsilons(driver, snap, set())
    assert driver.execute_script("return document.getElementById('curator').offsetParent") is None
    assert "cannot read the run's configuration" in driver.find_element(By.ID, "config").text
    assert console_errors(driver) == []
    # First render of a fresh page load (the token is in sessionStorage): from
    # navigation start to every chart drawn, with the 105-release history.
    times = []
    for _ in range(3):
        driver.refresh()
        wait_ready(driver)
        times.append(driver.execute_script("return window.dpDashboard.firstRenderMs"))
    print(f"\nviewer: first render of a page load {', '.join(f'{t:.0f}' for t in times)} ms (105 releases)")
    # The token is kept in sessionStorage only.
    assert driver.execute_script("return localStorage.length") == 0
    assert driver.execute_script("return document.cookie") == ""
    screenshot(driver, "viewer")


def test_trainer(run, driver):
    # A trainer reads what a viewer reads (docs/security.md) and the run's
    # configuration: the viewer's page with the hyperparameters.
    snap = snapshot(run)
    open_with(driver, run, run.token("trainer", "run1"))
    wait_ready(driver)
    check_common(driver, run, snap)
    check_no_other_epsilons(driver, snap, set())
    assert driver.execute_script("return document.getElementById('curator').offsetParent") is None
    assert driver.execute_script("return document.getElementById('login').offsetParent") is None
    assert "noise multiplier" in driver.find_element(By.ID, "config").text
    assert driver.execute_script("return window.dpDashboard.data.exact") is None
    assert console_errors(driver) == []


def test_owner(run, driver):
    snap = snapshot(run)
    worst, rel, eps = snap
    open_with(driver, run, run.token("owner", "run1", [OWNED]))
    wait_ready(driver)
    check_common(driver, run, snap)
    check_no_other_epsilons(driver, snap, {OWNED})
    rows = driver.find_element(By.ID, "owner-rows").text
    assert fmt(eps[OWNED]) in rows and fmt(worst["epsilon"]) in rows
    assert eps[OWNED] < worst["epsilon"]
    latest = next(r for r in rel["releases"] if r["values"].get("population"))
    qs = latest["values"]["population"]["quantiles"]
    assert f"release #{latest['id']}" in rows
    assert any(fmt(q["value"]) in rows for q in qs)
    explain = driver.find_element(By.ID, "owner-explain").text
    assert "Guaranteed for every example" in explain and fmt(eps[OWNED]) in explain and len(explain) > 300
    assert "with probability 1 − " in explain and "Estimate" in explain
    assert console_errors(driver) == []
    screenshot(driver, "owner")


def mint(secret_b64, claims):
    enc = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    head = enc(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = enc(json.dumps(claims).encode())
    key = base64.b64decode(secret_b64)
    sig = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{enc(sig)}"


def test_bad_and_expired_tokens(run, driver):
    now = int(time.time())
    claims = {"sub": "t", "role": "viewer", "dataset": "run1", "iat": now - 7200, "exp": now - 3600, "iss": "dpledger"}
    secret = (run.data_dir / "secret").read_text().strip()
    expired = mint(secret, claims)
    # The server itself refuses it, so the page's message matches the API.
    assert run.call("GET", "/v1/datasets/run1/worst-case", expired)[0] == 401
    open_with(driver, run, expired)
    WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "message").is_displayed())
    assert "This token expired at" in driver.find_element(By.ID, "message").text
    assert driver.find_element(By.ID, "token-input").is_displayed()
    assert driver.execute_script("return sessionStorage.length") == 0
    assert console_errors(driver) == []
    screenshot(driver, "expired-token")

    open_with(driver, run, "not-a-token")
    WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "message").is_displayed())
    assert "not a dpledger token" in driver.find_element(By.ID, "message").text
    assert console_errors(driver) == []

    forged = mint(base64.b64encode(b"x" * 32).decode(), {**claims, "exp": now + 3600})
    open_with(driver, run, forged)
    WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "message").is_displayed())
    assert "The server refused this token (401)" in driver.find_element(By.ID, "message").text
    assert not driver.find_element(By.ID, "dash").is_displayed()
    # Only the 401 the page reports, nothing else.
    assert console_errors(driver, allow=r"status of 401") == []


def test_refreshes_while_training(run, driver):
    open_with(driver, run, run.token("viewer", "run1"), "?refresh=1")
    wait_ready(driver)
    before = driver.execute_script("return window.dpDashboard.data.api.worst.steps")
    step(run, before, run.rng)
    rel = release(run)
    WebDriverWait(driver, 20).until(
        lambda d: d.execute_script("return window.dpDashboard.data.releases.ids.slice(-1)[0]") == rel["release"]["id"]
        if isinstance(rel, dict) and "release" in rel
        else d.execute_script("return window.dpDashboard.data.api.worst.steps") == before + 1
    )
    assert driver.execute_script("return window.dpDashboard.data.api.worst.steps") == before + 1
    assert driver.execute_script("return window.dpDashboard.renders") >= 2
    assert console_errors(driver) == []

#!/usr/bin/env python3
"""membill's HTML page in a real browser (headless Chromium through chromedriver's WebDriver).

Hovers the timeline at the total peak's time (taken from the JSON report, not from the page) and
reads the composition the page shows: it must equal the report's, category by category, to the
byte. Then pins the total peak, clicks phases (the button and the name on the chart: each
phase's peak against the report's), toggles a category, zooms by dragging and resets by
double-clicking; the compare page (side by side, overlaid) and a meta plan's page load and draw.
A screenshot of each state goes to OUT_DIR. WebDriver is plain HTTP and JSON, so the standard
library is enough: nothing is downloaded at test time.

usage: html_in_browser.py MEMBILL GOLDEN_DIR OUT_DIR    (exit 77: skipped, and why)
MEMBILL_HEAVY=1: SmolLM2-135M's real step instead (its page's size, the read-out at its peak, and
its trace's slices at the peak against the report).
MEMBILL_REQUIRE_BROWSER=1 (CI): no browser is a failure, not a skip.
"""
import base64
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

CATS = ["weight", "gradient", "optimizer", "activation", "cache", "temporary", "other"]
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def skip(why):
    print("skipped: " + why)
    note = os.environ.get("MEMBILL_SKIP_NOTE")
    if note:  # ctest's summary prints it (tests/skipped.sh)
        os.makedirs(os.path.dirname(note), exist_ok=True)
        with open(note, "w") as f:
            f.write(why + "\n")
    sys.exit(77)


class Browser:
    def __init__(self, driver, chromium, profile):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.proc = subprocess.Popen([driver, "--port=%d" % self.port], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                self.http("GET", "/status")
                break
            except OSError:
                time.sleep(0.1)
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1100",
                "--disable-dev-shm-usage", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--user-data-dir=" + profile]
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": chromium, "args": args}}}}
        self.sid = self.http("POST", "/session", caps)["sessionId"]

    def http(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            raise RuntimeError("%s %s: %s" % (method, path, e.read()[:400].decode(errors="replace")))

    def cmd(self, method, path, body=None):
        return self.http(method, "/session/%s%s" % (self.sid, path), body)

    def js(self, script, *args):
        return self.cmd("POST", "/execute/sync", {"script": script, "args": list(args)})

    def open(self, path):
        self.cmd("POST", "/url", {"url": "file://" + path})
        for _ in range(200):
            if self.js("return document.body && document.body.dataset.ready === '1'"):
                return True
            time.sleep(0.05)
        return False

    def find(self, css):
        e = self.cmd("POST", "/element", {"using": "css selector", "value": css})
        return list(e.values())[0]

    def click(self, css):
        self.cmd("POST", "/element/%s/click" % self.find(css), {})

    def pointer(self, steps):
        acts = [{"type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"}, "actions": steps}]
        self.cmd("POST", "/actions", {"actions": acts})
        self.cmd("DELETE", "/actions")

    def shot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.cmd("GET", "/screenshot")))

    def close(self):
        try:
            self.cmd("DELETE", "")
        finally:
            self.proc.terminate()
            self.proc.wait()


def plot_geometry(b, chart=0):
    return b.js("""const a = document.querySelector('#chart%d .plot-area');
                   a.scrollIntoView({block: 'center'});
                   const r = a.getBoundingClientRect();
                   return {left: r.left, top: r.top, height: r.height, x0: +a.dataset.x0, x1: +a.dataset.x1,
                           n: +a.dataset.ncols, axis: a.dataset.axis};""" % chart)


def column_x(g, x):
    """The viewport x of the pixel column that holds axis value x (the page's own mapping)."""
    col = min(g["n"] - 1, max(0, math.floor((x - g["x0"]) / (g["x1"] - g["x0"]) * g["n"])))
    return math.ceil(g["left"] + col), col


def shown(b, panel="#panel0"):
    rows = b.js("return [...document.querySelectorAll('%s table.composition tr[data-cat]')]"
                ".map(r => [r.dataset.cat, +r.dataset.bytes])" % panel)
    return {k: v for k, v in rows}


def same_composition(got, want, what):
    for c in CATS:
        check(got.get(c) == want[c], "%s: %s %s == report %s" % (what, c, got.get(c), want[c]))
    check(got.get("total") == sum(want[c] for c in CATS), "%s: total %s" % (what, got.get("total")))


def bar_rows(b, report, what):
    """The bill's lists by op and by block: every row of the report there (past the first 16,
    behind a "N more" that says how many), no label cut."""
    br = report.get("breakdown", {})
    for key, word in (("activation_by_op", "op"), ("activation_by_block", "block")):
        n = len(br.get(key, []))
        got = b.js("""const h = [...document.querySelectorAll('#pictures h3')].find(h => h.textContent.endsWith(arguments[0]));
                      if (!h) return null;
                      const box = h.nextElementSibling, d = box.querySelector('details');
                      if (d) d.open = true;
                      const labels = [...box.querySelectorAll('.bar-label')];
                      return {rows: box.querySelectorAll('.bar-row').length, more: d ? d.querySelector('summary').textContent : '',
                              cut: labels.filter(l => l.scrollWidth > l.clientWidth + 1).length};""", "by " + word)
        if n == 0:
            check(got is None, "%s: no list by %s without rows" % (what, word))
            continue
        check(got is not None and got["rows"] == n, "%s: the list by %s holds the report's %d rows: %s" % (what, word, n, got))
        more = "%d more %ss (%d in all)" % (n - 16, word, n) if n > 16 else ""
        check(got is not None and got["more"] == more, "%s: by %s, the hidden rows said: '%s'" % (what, word, more))
        check(got is not None and got["cut"] == 0, "%s: by %s, no label cut" % (what, word))


def train_page(b, page, report, shots):
    check(b.open(page), "train page loads and its script runs")
    peak = report["peak"]
    g = plot_geometry(b)
    check(g["axis"] == "time", "a real run's axis is time")
    x, col = column_x(g, peak["seconds"])
    y = g["top"] + g["height"] / 2
    # The page's clock sums the timeline's whole-microsecond steps, the report's is the
    # profiler's own: at a column's edge the two can fall a column apart (a tiny run's column is
    # a few microseconds), so the peak is looked for in the column and its two neighbours.
    got = None
    for c in (col, col - 1, col + 1):
        if 0 <= c < g["n"]:
            b.pointer([{"type": "pointerMove", "x": x + c - col, "y": int(y), "duration": 0}])
            got = shown(b)
            if all(got.get(k) == peak["composition"][k] for k in CATS):
                col = c
                break
    same_composition(got, peak["composition"], "hover at the peak's time (column %d)" % col)
    where = b.js("return document.querySelector('#panel0 .where').textContent")
    check(peak["phase"] in where, "the read-out names the peak's phase: " + where)
    check(b.js("return document.querySelectorAll('#panel0 table.top-live tr[data-bytes]').length") > 0,
          "the read-out lists the live tensors")
    b.shot(os.path.join(shots, "1-hover-peak.png"))
    bar_rows(b, report, "train page")

    b.click("button.total-peak")
    check(b.js("return document.querySelector('#panel0').dataset.pinned") == "1", "the total peak button pins")
    same_composition(shown(b), peak["composition"], "pinned total peak")
    b.pointer([{"type": "pointerMove", "x": int(g["left"]) + 3, "y": int(y), "duration": 0}])
    same_composition(shown(b), peak["composition"], "a pinned read-out stays while the pointer moves")
    b.shot(os.path.join(shots, "2-pinned-peak.png"))

    phases = {p["name"]: p for p in report["phases"] if p.get("entries") == 1}
    b.click("button.phase-peak[data-phase='forward']")
    same_composition(shown(b), phases["forward"]["composition"], "forward's peak, from its button")
    v = [float(s) for s in b.js("return document.body.dataset.view").split(",")]
    check(v[1] - v[0] < g["x1"] - g["x0"], "a phase click zooms in: %s" % v)
    b.shot(os.path.join(shots, "3-phase-forward.png"))
    b.js("document.querySelector('#reset-zoom').click()")
    name = "backward"
    ref = b.js("return [...document.querySelectorAll('svg text.phase-label')].find(t => t.textContent === 'backward')")
    b.cmd("POST", "/element/%s/click" % list(ref.values())[0], {})
    if name in phases:
        same_composition(shown(b), phases[name]["composition"], "%s's peak, from its name on the chart" % name)
    else:
        check(False, "the clicked phase name %r is a phase of the report" % name)

    b.js("document.querySelector('#reset-zoom').click()")
    b.click("#toggles input[data-cat='weight']")
    n_weight = b.js("return document.querySelectorAll('#chart0 path[data-cat=weight]').length")
    n_other = b.js("return document.querySelectorAll('#chart0 path[data-cat=gradient]').length")
    check(n_weight == 0 and n_other > 0, "toggling weight off removes its band only (%d, %d)" % (n_weight, n_other))
    b.shot(os.path.join(shots, "4-weight-off.png"))
    b.click("#toggles input[data-cat='weight']")

    b.click(".unpin")
    g = plot_geometry(b)
    a, _ = column_x(g, g["x0"] + (g["x1"] - g["x0"]) * 0.2)
    z, _ = column_x(g, g["x0"] + (g["x1"] - g["x0"]) * 0.6)
    b.pointer([{"type": "pointerMove", "x": a, "y": int(y), "duration": 0}, {"type": "pointerDown", "button": 0},
               {"type": "pointerMove", "x": z, "y": int(y), "duration": 100}, {"type": "pointerUp", "button": 0}])
    g2 = plot_geometry(b)
    col_w = (g["x1"] - g["x0"]) / g["n"]
    want0, want1 = g["x0"] + (a - g["left"]) * col_w, g["x0"] + (z - g["left"]) * col_w
    check(abs(g2["x0"] - want0) <= 2 * col_w and abs(g2["x1"] - want1) <= 2 * col_w,
          "drag zooms to the dragged range: %.4f..%.4f, dragged %.4f..%.4f" % (g2["x0"], g2["x1"], want0, want1))
    b.shot(os.path.join(shots, "5-zoomed.png"))
    b.pointer([{"type": "pointerMove", "x": a, "y": int(y), "duration": 0},
               {"type": "pointerDown", "button": 0}, {"type": "pointerUp", "button": 0},
               {"type": "pointerDown", "button": 0}, {"type": "pointerUp", "button": 0}])
    g3 = plot_geometry(b)
    check(g3["x0"] == g["x0"] and g3["x1"] == g["x1"], "double-click shows the whole run again")

    b.click("input[name=scale][value=split]")
    check(b.js("return document.querySelectorAll('#chart0 path[data-cat=activation]').length") == 2,
          "the split scale draws activations again on a scale of their own")
    b.shot(os.path.join(shots, "6-split.png"))
    b.click("input[name=scale][value=log]")
    b.shot(os.path.join(shots, "7-log.png"))
    check(b.js("return document.querySelector('#four-copies') !== null"), "the four-copies bar is drawn")


def compare_page(b, page, shots):
    check(b.open(page), "compare page loads")
    check(b.js("return document.querySelectorAll('svg.timeline').length") == 2, "side by side: two charts")
    ticks = b.js("return [0, 1].map(i => [...document.querySelectorAll('#chart' + i + ' text.tick')]"
                 ".map(t => t.textContent).join(' '))")
    check(ticks[0] == ticks[1], "both charts on one scale and one (normalised) axis")
    b.shot(os.path.join(shots, "8-compare-side.png"))
    b.click("input[name=layout][value=overlay]")
    check(b.js("return document.querySelectorAll('svg.timeline').length") == 1, "overlaid: one chart")
    check(b.js("return document.querySelectorAll('#panel0 table.composition').length") == 2,
          "the overlaid read-out shows both runs")
    b.shot(os.path.join(shots, "9-compare-overlay.png"))


def check_page(b, page, report, shots):
    check(b.open(page), "check page loads")
    rows = b.js("return [...document.querySelectorAll('table.claims tr')].slice(1).map(r => r.className)")
    want = ["na" if c["pass"] is None else "pass" if c["pass"] else "fail" for c in report["claims"]]
    check(rows == want, "the claims table: %d rows, as the report's %d claims" % (len(rows), len(want)))
    b.shot(os.path.join(shots, "11-check.png"))


def trace_at_peak(path, report):
    """The trace's tensor slices live at its total-peak instant, summed by category, and plain
    malloc's counter track then; no slice of plain malloc."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    at = next(e["ts"] for e in events if e["ph"] == "i" and e["name"] == "total peak")
    begins, live = {}, {c: 0 for c in CATS}
    for e in events:
        if e["ph"] == "b":
            begins[e["id"]] = e
        elif e["ph"] == "e" and begins[e["id"]]["ts"] <= at < e["ts"]:
            live[e["cat"]] += begins[e["id"]]["args"]["bytes"]
        elif e["ph"] == "C" and e["name"] == "other" and e["ts"] <= at:
            live["other"] = e["args"]["bytes"]
    check(all(e["cat"] != "other" for e in begins.values()), "SmolLM2-135M: no slice of plain malloc in the trace")
    same_composition(dict(live, total=sum(live.values())), report["peak"]["composition"],
                     "SmolLM2-135M: the trace's slices at the peak")


def heavy_page(b, page, report, shots):
    """SmolLM2-135M's real step: thousands of allocations, the read-out at the peak still exact."""
    size = os.path.getsize(page)
    check(size < 2_000_000, "the SmolLM2-135M page stays small: %d bytes" % size)
    t0 = time.time()
    check(b.open(page), "SmolLM2-135M page loads (%.1f s)" % (time.time() - t0))
    g = plot_geometry(b)
    x, col = column_x(g, report["peak"]["seconds"])
    b.pointer([{"type": "pointerMove", "x": x, "y": int(g["top"] + g["height"] / 2), "duration": 0}])
    same_composition(shown(b), report["peak"]["composition"], "SmolLM2-135M: hover at the peak (column %d)" % col)
    b.shot(os.path.join(shots, "smollm2-hover-peak.png"))
    bar_rows(b, report, "SmolLM2-135M page")
    b.click("input[name=scale][value=split]")
    b.shot(os.path.join(shots, "smollm2-split.png"))


def plan_page(b, page, shots):
    check(b.open(page), "plan (meta) page loads")
    check(plot_geometry(b)["axis"] == "event", "a meta run's axis is event order")
    check(b.js("return document.querySelector('input[name=axis][value=time]').disabled"), "time is not offered")
    b.shot(os.path.join(shots, "10-plan-meta.png"))


def main():
    membill, golden, shots = sys.argv[1:4]
    heavy = os.environ.get("MEMBILL_HEAVY") == "1"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    missing = None if chromium else "chromium is not installed"
    missing = missing or (None if driver else "chromedriver is not installed")
    if missing:
        # CI installs both (.ci/deps --ci) and sets MEMBILL_REQUIRE_BROWSER: there a skip is a failure.
        if os.environ.get("MEMBILL_REQUIRE_BROWSER") == "1":
            print("FAIL  " + missing + " and MEMBILL_REQUIRE_BROWSER=1")
            sys.exit(1)
        skip(missing + " (Debian: apt-get install chromium chromium-driver; .ci/deps --ci installs them)")
    os.makedirs(shots, exist_ok=True)
    work = tempfile.mkdtemp(prefix="membill_browser_")
    tiny = os.path.join(golden, "tiny_tied")

    def run(*a):
        subprocess.run([membill, *a, "--quiet"], check=True)

    def load(name):
        with open(os.path.join(work, name)) as f:
            return json.load(f)

    if heavy:
        run("train", "--html", work + "/train.html", "--json", work + "/train.json", "--trace", work + "/trace.json")
        trace_at_peak(work + "/trace.json", load("train.json"))
    else:
        run("train", "--weights", tiny, "--html", work + "/train.html", "--json", work + "/train.json")
        run("compare", "--weights", tiny, "--new-tokens", "4", "--html", work + "/compare.html")
        run("plan", "--config", tiny + "/config.json", "--html", work + "/plan.html")
        run("check", "--no-speed", "--html", work + "/check.html", "--json", work + "/check.json")
    b = Browser(driver, chromium, work + "/profile")
    try:
        if heavy:
            heavy_page(b, work + "/train.html", load("train.json"), shots)
        else:
            train_page(b, work + "/train.html", load("train.json"), shots)
            compare_page(b, work + "/compare.html", shots)
            plan_page(b, work + "/plan.html", shots)
            check_page(b, work + "/check.html", load("check.json"), shots)
    finally:
        b.close()
        shutil.rmtree(work, ignore_errors=True)
    print("screenshots in " + shots)
    if failures:
        print("%d checks failed" % len(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()

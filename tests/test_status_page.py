"""The status web page in a real browser (headless Debian Chromium) while a small swarm runs.

Also checks what the page is made of over plain HTTP: the page and its files
(no external assets), the Prometheus metrics, and the JSON it reads.
"""

import json
import re
import time
import urllib.request

import pytest
from selenium.webdriver.common.by import By

from protocol.identity import load_or_create
from tests import browser as chromium

LEARNER_ARGS = (
    "--mode",
    "async",
    "--steps",
    "100000",
    "--status-port",
    "0",
    "--bootstrap-ping-s",
    "1",
    "--eval-every",
    "1",
)
# A name a hostile operator could give their node (within the 32 characters a
# name may have): as HTML it would load an image that fails and run its handler.
EVIL = "<img src=x onerror=pwned=1>"


def fetch(url):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.headers, resp.read()


def wait_for(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)  # polling state another process (or the browser) owns


def start(swarm):
    swarm.start_bootstrap()
    swarm.start_learner(*LEARNER_ARGS)
    api = swarm.root / "learner" / "api.json"
    wait_for(api.exists, 120, "the learner's api.json")
    swarm.start_node(0, "--name", EVIL)
    swarm.start_node(1, "--name", "honest node")
    return json.loads(api.read_text())["url"]


@pytest.mark.timeout(600)
@pytest.mark.skipif(
    not chromium.available(), reason="Chromium not installed: apt-get install chromium chromium-driver (make test does)"
)
def test_the_page_shows_the_swarm_in_a_browser(swarm_factory, tmp_path):
    url = start(swarm_factory)
    node_ids = [load_or_create(swarm_factory.root / f"node{i}" / "identity.key").peer_id_str for i in range(2)]
    started = time.monotonic()
    browser = chromium.chromium(tmp_path / "profile", tmp_path / "chromedriver.log")
    try:
        browser.get(url)
        seen = wait_for(
            lambda: browser.execute_script("""
            const rows = [...document.querySelectorAll('#peers tbody tr')].map(r => r.cells[0].textContent);
            const names = [...document.querySelectorAll('#peers tbody tr')].map(r => r.cells[1].textContent);
            const line = document.querySelector('#reward-chart polyline');
            const points = line ? Number(line.getAttribute('data-points')) : 0;
            const heldout = document.querySelectorAll('#reward-chart circle.heldout').length;
            return rows.length >= 2 && points >= 2 && heldout >= 1 ? {rows, names, points} : null;
        """),
            300,
            "two peers in the table, a reward curve and a held-out accuracy",
        )
        assert sorted(seen["rows"]) == sorted("…" + p[-12:] for p in node_ids)
        # The hostile name is shown as the text it is; nothing in it ran.
        assert sorted(seen["names"]) == sorted([EVIL, "honest node"])
        assert browser.execute_script(
            "return window.pwned === undefined && !document.querySelector('main img, main script')"
        )
        text = browser.find_element(By.TAG_NAME, "body").text
        assert "connecting" not in text and "cannot reach" not in text and "no batch refused" in text
        assert "built-in tiny llama" in text and "async" in text and "answers ping in" in text
        assert re.search(r"held-out accuracy\s+\d\.\d{3} \(95 % CI", text), text
        png = browser.get_screenshot_as_png()
        (tmp_path / "status-page.png").write_bytes(png)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
        print(
            f"status page: peers and reward curve after {time.monotonic() - started:.1f} s; "
            f"screenshot {tmp_path / 'status-page.png'} ({len(png)} bytes)"
        )
        # A node's receipts, looked up by its peer id, typed in as a person would.
        field = browser.find_element(By.ID, "receipts-peer")
        field.send_keys(node_ids[1])
        browser.find_element(By.CSS_SELECTOR, "#receipts-form button").click()
        receipts = wait_for(
            lambda: browser.execute_script(
                "return [...document.querySelectorAll('#receipts-table tbody tr')].map(r => r.cells[1].textContent)"
            ),
            90,
            "the node's receipts",
        )  # under load the page may wait on the ledger
        assert set(receipts) == {"accepted"}
        # Input is shown as text, never run as HTML.
        browser.execute_script("document.getElementById('receipts').textContent = ''")
        field.clear()
        field.send_keys('<img src=x onerror="window.pwned=1">')
        browser.find_element(By.CSS_SELECTOR, "#receipts-form button").click()
        shown = wait_for(lambda: browser.find_element(By.ID, "receipts").text, 30, "the receipts answer")
        assert shown.startswith("0 signed receipts for")
        assert browser.execute_script("return window.pwned === undefined && !document.querySelector('#receipts img')")
        # The bootstrap peer goes away: the page says so within a few pings.
        assert swarm_factory.stop("bootstrap") == 0
        down = wait_for(
            lambda: browser.execute_script(
                "const li = document.querySelector('#bootstrap li.down'); return li && li.textContent"
            ),
            60,
            "the page to show the bootstrap peer down",
        )
        assert "no answer" in down and "last answer" in down
    finally:
        browser.quit()


def test_the_page_its_files_and_metrics_over_http(swarm_factory):
    url = start(swarm_factory)
    status, headers, html = fetch(url)
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in headers["content-security-policy"]
    # Everything the page loads comes from the learner itself.
    assets = re.findall(rb'(?:src|href)="([^"]+)"', html)
    assert sorted(assets) == [b"/app.js", b"/style.css"]
    for asset, kind in ((b"/app.js", "text/javascript"), (b"/style.css", "text/css")):
        status, headers, body = fetch(url.rstrip("/") + asset.decode())
        assert status == 200 and headers["content-type"].startswith(kind) and body
    assert b"innerHTML" not in fetch(url + "app.js")[2]  # peer data only ever goes in as text

    def accepted():
        return json.loads(fetch(url + "api/status")[2])["rollouts_accepted"] > 0

    wait_for(accepted, 300, "accepted rollouts")
    # The API answers from a snapshot up to a second old: read it before the
    # metrics, so that the metrics can only be as new or newer.
    api = json.loads(fetch(url + "api/status")[2])
    status, headers, body = fetch(url + "metrics")
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    metrics = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            metrics[name] = float(value)
    assert metrics["echo_rollouts_accepted_total"] > 0
    assert metrics["echo_policy_version"] >= 0 and metrics["echo_peers"] >= 1
    assert metrics["echo_broadcast_bytes_total"] > 0
    assert metrics["echo_rollouts_accepted_total"] >= api["rollouts_accepted"]  # counters only grow
    assert api["broadcast"]["bytes"] > 0
    (boot,) = api["bootstrap"]
    assert boot["connected"] is True and boot["answers"] is True and boot["rtt_ms"] > 0
    assert metrics[f'echo_bootstrap_up{{addr="{boot["addr"]}"}}'] == 1

    # Without its bootstrap peer the learner keeps training, and says the peer is gone.
    assert swarm_factory.stop("bootstrap") == 0

    def bootstrap_down():
        (boot,) = json.loads(fetch(url + "api/status")[2])["bootstrap"]
        return boot if boot["answers"] is False else None

    boot = wait_for(bootstrap_down, 60, "the learner to notice the bootstrap peer is gone")
    assert boot["error"] and boot["last_answer_s_ago"] is not None
    # /metrics too answers from a snapshot up to a second old, maybe taken before the peer left.
    down = f'echo_bootstrap_up{{addr="{boot["addr"]}"}} 0'
    wait_for(lambda: down in fetch(url + "metrics")[2].decode(), 10, "the metrics to say the bootstrap peer is down")

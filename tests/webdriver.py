"""A minimal W3C WebDriver client for Debian's chromedriver + headless Chromium.

Just what the browser tests use: start a session, open a URL, run a script,
take a screenshot. chromedriver runs as a child process on a free loopback
port and is stopped with the session.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1280,1400",
]


def available() -> bool:
    return Path(CHROMIUM).exists() and shutil.which(CHROMEDRIVER) is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    def __init__(self, profile: Path, log: Path):
        port = _free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.driver = subprocess.Popen(
            [CHROMEDRIVER, f"--port={port}", f"--log-path={log}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.driver.kill()
                raise RuntimeError("chromedriver did not start")
            time.sleep(0.1)  # polling another process's port
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": [*FLAGS, f"--user-data-dir={profile}"]},
        }}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.loads(resp.read())["value"]
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"webdriver {path}: {exc.read()[:500]!r}") from None

    def open(self, url: str) -> None:
        self._call("POST", f"/session/{self.session}/url", {"url": url})

    def run(self, script: str, *args: object) -> object:
        return self._call("POST", f"/session/{self.session}/execute/sync", {"script": script, "args": list(args)})

    def screenshot(self, path: Path) -> bytes:
        png = base64.b64decode(self._call("GET", f"/session/{self.session}/screenshot"))
        path.write_bytes(png)
        return png

    def close(self) -> None:
        try:
            self._call("DELETE", f"/session/{self.session}")
        finally:
            self.driver.terminate()
            self.driver.wait(10)

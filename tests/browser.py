"""Headless Debian Chromium driven by selenium, for the status page's browser test.

selenium starts Debian's chromedriver (never a downloaded one: the paths are
given and Selenium Manager is told to stay offline) and stops it with the
session.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Without the background-networking flags Chromium keeps dialling Google's
# hosts, which this machine's closed network refuses.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1400",
]


def available() -> bool:
    return Path(CHROMIUM).exists() and shutil.which(CHROMEDRIVER) is not None


def chromium(profile: Path, log: Path):  # -> selenium.webdriver.Chrome
    """A new headless Chromium session; ``quit()`` it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER, log_output=str(log)))

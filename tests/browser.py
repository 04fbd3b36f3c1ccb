"""Headless Debian Chromium driven by Selenium (``chromium`` and ``chromium-driver`` packages)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


#: Chromium's resolver finds no host but this machine: every external request fails.
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost"


@contextmanager
def chromium(tmp: Path, width: int = 1400, height: int = 1700, *, offline: bool = False
             ) -> Iterator[webdriver.Chrome]:
    """A fresh headless Chromium with its own profile; the driver is the Debian one (no download).

    Its console is kept (``driver.get_log("browser")``); ``offline`` blocks every other host.
    """
    if not Path(CHROMIUM).exists() or not Path(CHROMEDRIVER).exists():
        raise AssertionError("install Debian's chromium and chromium-driver (.ci/run does)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", f"--user-data-dir={tmp / 'profile'}",
                "--allow-file-access-from-files", *([OFFLINE] if offline else [])):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()

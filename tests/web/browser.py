"""A headless Chromium driven by selenium (Debian's chromium and chromium-driver), for the web page's tests
and the README's screenshot."""

from __future__ import annotations

import shutil
from pathlib import Path

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "") if p and Path(p).exists()), None)
CHROMEDRIVER = next((p for p in ("/usr/bin/chromedriver", shutil.which("chromedriver") or "")
                     if p and Path(p).exists()), None)
MISSING = None if CHROMIUM and CHROMEDRIVER else (
    "needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver): "
    + ", ".join(name for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)) if not path)
    + " not found")


def chrome(profile: Path, width: int = 1280, height: int = 900):
    """A fresh headless browser with its own profile folder (its own cookies)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     f"--window-size={width},{height}", f"--user-data-dir={profile}", "--no-first-run",
                     "--disable-extensions", "--disable-background-networking"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)

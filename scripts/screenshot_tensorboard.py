"""The README's TensorBoard screenshot (issue #33): a real TensorBoard server on a run's ``report_to:
tensorboard`` logs, opened in headless Chromium through selenium, as a user's browser would.

    .venv/bin/python scripts/screenshot_tensorboard.py LOGDIR OUT.png
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time


def main(logdir: str, out: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--port", str(port),
                               "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1000"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                driver.get(f"http://127.0.0.1:{port}/?tagFilter=accuracy%7Creward_mean%7Ceffective#timeseries")
                break
            except Exception:
                time.sleep(1)
        time.sleep(12)  # the page loads its scalars after the first paint
        driver.save_screenshot(out)
    finally:
        driver.quit()
        server.terminate()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

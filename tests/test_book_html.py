"""The rendered book in a real browser: a chapter's equations are typeset by the self-hosted MathJax
(no network) and its figures are shown.

The test builds a two-page book (the introduction and the first chapter, with the chapter's stored
outputs, so nothing is executed) into a temporary folder, serves it on localhost and opens it in
headless Chromium driven by Selenium. It is skipped where Chromium or ChromeDriver is missing
(``make setup`` installs them from Debian's packages where it can), except in CI, which sets
RLCURATE_REQUIRE_BROWSER=1.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CHAPTER = "01_gate"

pytestmark = pytest.mark.browser


def _need_browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    msg = "headless Chromium and chromedriver are needed (Debian packages chromium, chromium-driver)"
    if os.environ.get("RLCURATE_REQUIRE_BROWSER") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mini_book")
    config = yaml.safe_load((REPO / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"  # render the committed outputs
    (root / "_config.yml").write_text(yaml.safe_dump(config))
    (root / "_toc.yml").write_text(yaml.safe_dump({
        "format": "jb-book", "root": "book/intro",
        "chapters": [{"file": f"book/{CHAPTER}"}, {"file": "book/references"}],
    }))
    (root / "book").mkdir()
    for name in ("intro.md", f"{CHAPTER}.ipynb", "references.bib", "references.md"):
        shutil.copy(REPO / "book" / name, root / "book" / name)
    # the introduction links to chapters that this mini book does not hold
    intro = (root / "book" / "intro.md").read_text()
    (root / "book" / "intro.md").write_text(intro.split("## The map")[0])
    jb = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run([str(jb), "build", str(root), "--builder", "html", "-W", "--keep-going"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"jupyter-book failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return root / "_build" / "html"


@pytest.fixture(scope="module")
def server(built_site):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(built_site))
    handler.log_message = lambda *a, **k: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    chromium, driver_path = _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,2000"):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(driver_path), options=opts)
    drv.set_page_load_timeout(60)
    yield drv
    drv.quit()


def test_built_html_loads_mathjax_locally(built_site):
    html = (built_site / "book" / f"{CHAPTER}.html").read_text()
    assert "_static/mathjax" in html, "the page should load the self-hosted MathJax"
    assert "cdn.jsdelivr.net/npm/mathjax" not in html, "MathJax must not come from a CDN"


def test_chapter_equations_typeset_and_figures_shown(server, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{server}/book/{CHAPTER}.html")
    WebDriverWait(browser, 60).until(
        lambda d: d.execute_script("return document.querySelectorAll('mjx-container').length") > 0)
    WebDriverWait(browser, 60).until(lambda d: d.execute_script(
        "return Array.from(document.images).every(i => i.complete)"))
    n_math = browser.execute_script("return document.querySelectorAll('mjx-container').length")
    n_err = browser.execute_script("return document.querySelectorAll('mjx-merror, .MathJax_Error').length")
    raw_tex = browser.execute_script(
        "return Array.from(document.querySelectorAll('div.math, span.math'))"
        ".filter(e => !e.querySelector('mjx-container')).length")
    figures = browser.execute_script(
        "return Array.from(document.querySelectorAll('.cell_output img'))"
        ".map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
    assert n_math >= 5, f"only {n_math} typeset equations"
    assert n_err == 0, f"{n_err} MathJax errors"
    assert raw_tex == 0, f"{raw_tex} math blocks left untypeset"
    assert len(figures) >= 1, "no figure in the chapter's outputs"
    assert all(ok and w > 100 and h > 100 for ok, w, h in figures), f"a figure did not load: {figures}"


def test_intro_renders(server, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{server}/book/intro.html")
    WebDriverWait(browser, 60).until(
        lambda d: d.execute_script("return document.querySelectorAll('mjx-container').length") > 0)
    assert "Curating the Learning Signal" in browser.title

"""``reqmodel report``: the verdict matrix as a self-contained HTML page,
each violated cell linked to its counterexample (a sequence diagram and a
step table), rendered in headless Chromium: the page is screenshotted and
the picture inspected for the violated cells' colour, and the DOM the
browser built is read for the expected cells.

Chromium comes from Debian's ``chromium`` package (``.ci/run`` installs it
and sets ``REQMODEL_REQUIRE_BROWSER=1``, so CI cannot skip the browser
check); elsewhere the browser tests skip when no Chromium is installed."""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)
needs_browser = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("REQMODEL_REQUIRE_BROWSER"),
    reason="no Chromium here (CI installs it and requires it)")


def run(*args, cwd):
    return subprocess.run([sys.executable, "-c", "from reqmodel.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("report")
    r = run("report", "--scenario", "incident,retract-abort", "--out", "rep", cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert "report: rep/index.html" in r.stdout
    check = run("check", "--release", "all", "--scenario", "incident,retract-abort", "--json",
                "--out", "cx", cwd=cwd)
    return cwd / "rep", json.loads(check.stdout)


def cells(index_html: str):
    """(scenario, property, release) -> (verdict class, link or None)."""
    out = {}
    for m in re.finditer(r'<td class="([\w-]+)" data-release="([^"]+)" data-scenario="([^"]+)" '
                         r'data-property="([^"]+)">(.*?)</td>', index_html):
        link = re.search(r'href="([^"]+)"', m.group(5))
        out[(m.group(3), m.group(4), m.group(2))] = (m.group(1), link and link.group(1))
    return out


def test_the_matrix_matches_check_and_links_every_violation(made):
    rep, check = made
    index = (rep / "index.html").read_text()
    got = cells(index)
    assert len(got) == len(check["results"])
    for row in check["results"]:
        verdict, link = got[(row["scenario"], row["property"], row["release"])]
        assert verdict == row["verdict"]
        if verdict == "violated":
            assert link and (rep / link).is_file(), row
            page = (rep / link).read_text()
            assert "<svg" in page and f"{row['trace_length']} steps" in page
            assert page.count('<tr class="violating">') == 1 or row["property"] in (
                "answered-without-timeout",)  # a liveness trace marks no single step
        else:
            assert link is None
    assert got[("incident", "no-foreign-kv-read", "0.5.19")][0] == "violated"
    assert got[("incident", "no-foreign-kv-read", "0.5.21")][0] == "holds"


def test_the_pages_are_self_contained(made):
    rep, _ = made
    for page in rep.rglob("*.html"):
        text = page.read_text()
        assert "<script" not in text
        assert not re.search(r'(src|href)="(https?:)?//', text), page
        for link in re.findall(r'href="([^"#]+)', text):
            assert (page.parent / link).resolve().exists(), (page, link)


def _screenshot(page: pathlib.Path, png: pathlib.Path, size="1300,2600"):
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--window-size={size}",
                        f"--screenshot={png}", page.resolve().as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert png.is_file(), r.stderr[-2000:]


def _pixels_of(png: pathlib.Path, rgb) -> int:
    """How many pixels of the screenshot have exactly this colour."""
    from PIL import Image
    img = Image.open(png).convert("RGB")
    counts = {colour: n for n, colour in img.getcolors(img.width * img.height)}
    return counts.get(tuple(rgb), 0)


@needs_browser
def test_chromium_renders_the_matrix_and_a_counterexample(made, tmp_path):
    assert CHROMIUM, "REQMODEL_REQUIRE_BROWSER is set but no Chromium is installed"
    rep, check = made
    index = rep / "index.html"
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          index.resolve().as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    rendered = cells(dom)
    assert rendered[("incident", "no-foreign-kv-read", "0.5.19")][0] == "violated"
    assert sum(v == "violated" for v, _ in rendered.values()) == sum(
        r["verdict"] == "violated" for r in check["results"])
    # the screenshot shows violated cells in their colour, and holds in theirs
    shot = tmp_path / "index.png"
    _screenshot(index, shot)
    assert _pixels_of(shot, (0xf4, 0xb6, 0xb6)) > 5_000  # #f4b6b6, violated
    assert _pixels_of(shot, (0xcd, 0xec, 0xcd)) > 20_000  # #cdeccd, holds
    # the incident's counterexample: the diagram's violating band and notes
    _, link = rendered[("incident", "no-foreign-kv-read", "0.5.19")]
    page_shot = tmp_path / "cell.png"
    _screenshot(rep / link, page_shot, size="1300,2400")
    assert _pixels_of(page_shot, (0xff, 0xd7, 0xd7)) > 10_000  # the violating step's band
    assert _pixels_of(page_shot, (0xff, 0xf8, 0xc4)) > 10_000  # the notes' boxes


def test_report_refuses_bad_input_in_one_line(tmp_path):
    r = run("report", "--scenario", "nope", cwd=tmp_path)
    assert r.returncode == 2 and "unknown scenario 'nope'" in r.stderr
    assert not (tmp_path / "reqmodel-report").exists()

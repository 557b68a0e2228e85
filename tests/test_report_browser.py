"""The HTML report renders in a real browser: every figure loads, nothing is requested from outside,
no console error (headless Chromium; a planted broken copy proves the checks can fail)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from scalerepro.analysis.presentation import report

from report_study import CHROMIUM, REPO, Chromium, rendered_study


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[dict[str, Path], str, Path]:
    return rendered_study(tmp_path_factory)


@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed (Debian: apt-get install chromium)")
@pytest.mark.slow
def test_report_in_headless_chromium(study, tmp_path):
    _, page, out = study
    # A negative control: a copy of the report with a broken image and a console error, to
    # prove that the checks below can fail.
    broken = tmp_path / "broken.html"
    broken.write_text(page.replace("<main>", '<main><img src="no-such-figure.png"><script>console.error("planted")</script>', 1))
    browser = Chromium(tmp_path / "profile", tmp_path / "chromium.log")
    try:
        session = browser.open_page(out.as_uri(), 1400, 3000)
        found = browser.problems(session)
        shot = tmp_path / "report.png"
        size = browser.screenshot(session, shot, 1400)
        control = browser.problems(browser.open_page(broken.as_uri(), 1400, 3000))
    finally:
        browser.close()

    assert control["broken_images"] and any("planted" in error for error in control["errors"])
    assert any("no-such-figure.png" in error or "ERR_FILE_NOT_FOUND" in error for error in control["errors"])

    assert len(found["images"]) == len(report.FIGURE_NAMES) - 1, found["images"]
    assert not found["broken_images"], found["broken_images"]
    assert not found["errors"], found["errors"]
    assert not found["foreign_requests"], found["foreign_requests"]
    assert shot.read_bytes().startswith(b"\x89PNG") and size[1] > 3000
    published = REPO / "results" / "report"
    if published.is_dir():
        shutil.copyfile(shot, published / "screenshot.png")
    print(f"\nscreenshot of the rendered report ({size[0]}x{size[1]}): {shot}")

"""Render a report in headless Chromium and look at the pixels: where each chart landed on the page, and
whether anything was drawn there.  Used by the report tests, and to write the README's screenshots:

    python -m tests.browser REPORT.html OUT.png [HEIGHT]
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDTH = 1280
# After the charts have drawn, write where each one is, and the page's height, into the DOM.
PROBE = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const boxes = [...document.querySelectorAll("div.chart")].map(d => {
    const r = d.getBoundingClientRect();
    return [d.id, Math.round(r.left + scrollX), Math.round(r.top + scrollY), Math.round(r.width),
            Math.round(r.height)].join(",");
  });
  document.body.setAttribute("data-boxes", boxes.join(";"));
  document.body.setAttribute("data-height", document.documentElement.scrollHeight);
}, 3000));
</script>"""


@dataclass(frozen=True)
class Box:
    id: str
    x: int
    y: int
    w: int
    h: int


def _chromium(args: list[str], profile: Path) -> str:
    assert CHROMIUM is not None, "chromium is not installed"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
           f"--user-data-dir={profile}", "--virtual-time-budget=15000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout


def probed_copy(report: Path, folder: Path) -> Path:
    """A copy of ``report`` with the probe script added (the report itself is left as written)."""
    head, tail = report.read_text(encoding="utf-8").rsplit("</body>", 1)  # the last: the bundle holds the text too
    page = head + PROBE + "</body>" + tail
    out = folder / "probed.html"
    out.write_text(page, encoding="utf-8")
    return out


def layout(page: Path, folder: Path) -> tuple[str, list[Box], int]:
    """The rendered DOM, each chart's box on the page, and the page's height, at WIDTH pixels wide."""
    dom = _chromium([f"--window-size={WIDTH},1000", "--dump-dom", page.resolve().as_uri()], folder / "profile")
    boxes = re.search(r'data-boxes="([^"]*)"', dom)
    height = re.search(r'data-height="(\d+)"', dom)
    assert boxes and height, "the probe did not run: the page did not finish loading"
    parsed = [Box(p[0], *map(int, p[1:])) for p in (b.split(",") for b in boxes.group(1).split(";") if b)]
    return dom, parsed, int(height.group(1))


def screenshot(page: Path, out: Path, height: int, folder: Path) -> Path:
    _chromium([f"--window-size={WIDTH},{height}", f"--screenshot={out}", page.resolve().as_uri()],
              folder / "profile")
    return out


def ink(png: Path, box: Box) -> tuple[float, int]:
    """Within ``box`` of the screenshot: the share of pixels that are not background, and how many distinct
    colours there are.  A blank or failed chart has almost no ink and one or two colours."""
    import numpy as np
    from PIL import Image

    with Image.open(png) as im:
        px = np.asarray(im.convert("RGB").crop((box.x, box.y, box.x + box.w, box.y + box.h)))
    if px.size == 0:
        return 0.0, 0
    inked = (px.astype(int).sum(axis=2) < 3 * 245).mean()
    colours = len(np.unique(px.reshape(-1, 3), axis=0))
    return float(inked), colours


def main(argv: list[str]) -> int:
    report, out = Path(argv[0]), Path(argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        probed = probed_copy(report, Path(tmp))
        _, _, full = layout(probed, Path(tmp))
        screenshot(report, out, int(argv[2]) if len(argv) > 2 else full, Path(tmp))
    print(f"{out}: {WIDTH} px wide")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

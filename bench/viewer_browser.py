"""A real browser opens the exam viewer, clicks an event and photographs its frames.

Headless Chromium from the system packages, driven by the `playwright` Python package (its
driver only: no browser is downloaded), with a fresh profile and no network:

    apt-get install -y chromium && pip install playwright
    python -m bench.viewer_browser [--viewer plots/viewer] [--page test_ukdd_navi_00051.html]
        [--out docs/viewer_event.png] [--timeline-out docs/viewer_timeline.png]

Opens `--page` (default: the first test video of index.html, else the first video) as a
file:// URL, picks the event to click (default: the highest-ranked true positive of a finding
that has thumbnails, else any event with thumbnails), clicks it where the canvas draws it,
and checks what a user would see: no script error, the event selected (the URL's #fragment),
its thumbnails in the panel, every image decoded, no request leaving file://. Screenshots
the event panel to `--out` (and the page's timeline to `--timeline-out`); prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

from vce.core.labels import ANATOMY, LABELS

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"]


def page_data(path: Path) -> dict:
    text = path.read_text()
    match = re.search(r'<script type="application/json" id="viewer-data">(.*?)</script>', text, re.S)
    return json.loads(match.group(1).replace("<\\/", "</"))


def default_page(viewer: Path) -> str:
    links = re.findall(r'href="((?:test|validation|exam)_[^"#]+\.html)"', (viewer / "index.html").read_text())
    tests = [link for link in links if link.startswith("test_")]
    return (tests or links)[0]


def pick_event(data: dict) -> str:
    """A finding's best-ranked TP with thumbnails; else any submission event with thumbnails."""
    def ref(row):
        return f"pred-{row[6]}-{row[2]}"
    with_thumbs = [row for row in data["pred"] if data["thumbsOf"].get(ref(row))]
    findings = [row for row in with_thumbs if LABELS[row[2]] not in ANATOMY[:5]]
    for pool in ([r for r in findings if r[4] >= 0], [r for r in with_thumbs if r[4] >= 0], findings, with_thumbs):
        if pool:
            return ref(min(pool, key=lambda row: (row[3], -len(data["thumbsOf"][ref(row)]))))
    raise SystemExit("no event with thumbnails on this page")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--viewer", default="plots/viewer", help="the viewer folder")
    parser.add_argument("--page", default=None, help="video page to open (default: the first test video)")
    parser.add_argument("--ref", default=None, help="event to click, e.g. pred-3-10 (default: picked)")
    parser.add_argument("--out", default="docs/viewer_event.png", help="screenshot of the event panel")
    parser.add_argument("--timeline-out", default=None, help="also a screenshot of the timeline")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the system's Chromium")
    parser.add_argument("--width", type=int, default=1280, help="viewport width in CSS pixels")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    viewer = Path(args.viewer).resolve()
    name = args.page or default_page(viewer)
    ref = args.ref or pick_event(page_data(viewer / name))
    errors, outside = [], []
    with sync_playwright() as pw, tempfile.TemporaryDirectory(prefix="vce_chromium_") as profile:
        context = pw.chromium.launch_persistent_context(profile, executable_path=args.chromium, args=FLAGS,
                                                        headless=True, viewport={"width": args.width, "height": 900})
        page = context.new_page()
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file://")
                      else (outside.append(route.request.url), route.abort()))
        page.goto((viewer / name).as_uri())
        where = page.evaluate("(ref) => window.vceViewer.locate(ref)", ref)
        page.mouse.click(where["x"], where["y"])
        page.wait_for_function("document.querySelectorAll('#event-panel .thumbs img').length > 0", timeout=5000)
        page.wait_for_function("[...document.querySelectorAll('#event-panel img')].every(i => i.complete)")
        selected = page.evaluate("location.hash.slice(1)")
        images = page.evaluate("[...document.querySelectorAll('#event-panel .thumbs img')].map(i => i.naturalWidth)")
        title = page.inner_text("#event-panel h2")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        page.locator("#event-panel").screenshot(path=args.out)
        if args.timeline_out:
            page.locator("#timeline-panel").screenshot(path=args.timeline_out)
        context.close()
    result = {"page": name, "clicked": ref, "selected": selected, "title": title, "thumbnails": len(images),
              "decoded": sum(w > 0 for w in images), "errors": errors, "outside_requests": outside, "out": args.out}
    print(json.dumps(result, indent=2))
    ok = not errors and not outside and images and all(w > 0 for w in images) and selected.startswith("pred-")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

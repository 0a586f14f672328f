"""The viewer's acceptance check, shared by its unit tests and the end-to-end stage runs.

Parses every page with the standard library's HTML parser (no browser): each event of the
submission and of the clinical list has its entry on its video's page, the counts are the
files', every thumbnail and link resolves to a file in the folder, and no page, script or style
refers to the network.
"""

from __future__ import annotations

import json
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

from vce.core.io import safe_file_name
from vce.core.labels import LABEL_INDEX

NETWORK = ("http://", "https://", "//")


class Page(HTMLParser):
    """Every (tag, attribute, value) of a page, and the inline JSON data if any."""

    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, str, str]] = []
        self.data_text: str | None = None
        self._in_data = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in ("src", "href"):
            if attrs.get(name) is not None:
                self.links.append((tag, name, attrs[name]))
        self._in_data = tag == "script" and attrs.get("id") == "viewer-data"

    def handle_endtag(self, tag):
        self._in_data = False

    def handle_data(self, data):
        if self._in_data:
            self.data_text = (self.data_text or "") + data


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text())
    page.close()
    return page


def event_pairs(submission: dict, video_id: str) -> Counter:
    """(event index, label index, start, end) of every (event, label) of one video of a file."""
    events = next((v["events"] for v in submission["videos"] if str(v["video_id"]) == str(video_id)), [])
    return Counter((e, LABEL_INDEX[label], event["start"], event["end"])
                   for e, event in enumerate(events) for label in event["label"])


def check_viewer(folder, sets: dict[str, tuple[dict, dict]]) -> dict:
    """Assert the viewer in `folder` shows `sets` (name -> (submission, clinical list)); its counts.

    Returns {"pages", "links", "thumbnails", "events"} so a caller can assert on more.
    """
    folder = Path(folder)
    pages = sorted(folder.glob("*.html"))
    assert (folder / "index.html") in pages
    counts = {"pages": len(pages), "links": 0, "thumbnails": 0, "events": 0}
    # 1. No network anywhere: not in a link, not in a script or a style.
    for path in [*pages, *folder.glob("*.js"), *folder.glob("*.css")]:
        text = path.read_text()
        assert "http://" not in text and "https://" not in text, f"{path.name} names a network URL"
    # 2. Every src/href resolves to a file of the folder (anchors inside a page aside).
    for path in pages:
        for tag, name, value in parse(path).links:
            assert not value.startswith(NETWORK) and ":" not in value.split("#")[0], (path.name, tag, value)
            target = value.split("#")[0]
            if target:
                assert (folder / target).is_file(), f"{path.name}: <{tag} {name}={value!r}> does not resolve"
                counts["links"] += 1
    # 3. Every video of every set: its page, its events one to one, its thumbnails on disk.
    index_links = {value for _, _, value in parse(folder / "index.html").links}
    for set_name, (submission, clinical) in sets.items():
        for video in submission["videos"]:
            video_id = str(video["video_id"])
            name = f"{safe_file_name(set_name)}_{safe_file_name(video_id)}.html"
            assert name in index_links, f"index.html does not link {name}"
            data = json.loads(parse(folder / name).data_text)
            assert (data["set"], data["video"]) == (set_name, video_id)
            for kind, expected in (("pred", submission), ("clin", clinical)):
                shown = Counter((r[6], r[2], r[0], r[1]) for r in data[kind])
                assert shown == event_pairs(expected, video_id), f"{name}: {kind} entries differ from the file"
                counts["events"] += sum(shown.values()) if kind == "pred" else 0
            for _t, file, probs in data["thumbs"]:
                assert (folder / file).is_file(), f"{name}: thumbnail {file} missing"
                assert len(probs) == 17
            refs = {f"{kind}-{r[6]}-{r[2]}" for kind in ("pred", "clin", "gt") for r in data[kind]}
            for ref, ids in data["thumbsOf"].items():
                assert ref in refs and all(0 <= i < len(data["thumbs"]) for i in ids), (name, ref)
            counts["thumbnails"] += len(data["thumbs"])
    return counts

"""The frame index: one row per frame of the Galar layout (labelled) and of the test layout.

Reads file names, sizes and label CSVs only, never pixels. Contract of both tables, sorted by
`video_id` then `frame`:
    video_id    str     Galar: the integer id ("1", also from `recording_1/` or `001/`);
                        test: the folder name exactly ("ukdd_navi_00051")
    frame       int64   the number in the file name
    index       int64   Galar: the CSV's `index` (annotated-frame counter); test: 0-based position
    path        str     relative to the layout's root
    <17 labels> uint8   Galar only, named exactly as vce.core.labels.LABELS
    event_unit  str     "index" (Galar: the official ground truth counts annotated frames)
                        or "frame" (test: events use the file's frame number)
    capsule     str     capsule system from metadata.csv, else ""

Bad input: an error (ValueError naming the file) where results would be wrong, a counted
warning in the index report where skipping is safe (vce.data.frame_files.WARNING_KINDS).
"""

from __future__ import annotations

import csv as _csv
import difflib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import Field

from vce.core.errors import DataError
from vce.core.labels import LABELS
from vce.core.params import Section
from vce.data.frame_files import IndexReport, drop_bad_files, find_folders, list_frames

# Names end with \Z, not $: `$` also matches before a trailing newline ("ukdd_navi_00051\n").
GALAR_VIDEO_FOLDER = re.compile(r"^(?:recording_)?0*(\d+)\Z", re.IGNORECASE)
GALAR_FRAME = re.compile(r"^frame_(\d+)\.png\Z", re.IGNORECASE)
GALAR_LABEL_CSV = re.compile(r"^0*(\d+)\.csv\Z", re.IGNORECASE)
TEST_VIDEO_FOLDER = re.compile(r"^ukdd_navi_\d+\Z")
TEST_FRAME = re.compile(r"^frame_(\d+)\.png\Z", re.IGNORECASE)
TEST_LIST_CSV = re.compile(r"^(ukdd_navi_\d+)\.csv\Z")
# Near-misses of the folder names (spaces, a newline around them): named in an error, not skipped.
LOOSE_NAME = {GALAR_VIDEO_FOLDER: re.compile(r"^\s*(?:recording_)?0*(\d+)\s*\Z", re.IGNORECASE),
              TEST_VIDEO_FOLDER: re.compile(r"^\s*ukdd_navi_\d+\s*\Z")}
MAX_FRAME_NUMBER = 2**53  # frame and index values must be exact integers (also as float64)
FOLDER_DEPTH = 3  # video folders sit at most this deep under a root (root/archive/video)
COLUMNS = ["video_id", "frame", "index", "path", *LABELS, "event_unit", "capsule"]
TEST_COLUMNS = [c for c in COLUMNS if c not in LABELS]


class DataParams(Section):
    """`data`: where the frames and labels are."""

    root: str = Field(min_length=1)
    labels_dir: str = Field(min_length=1)
    metadata: str | None
    test_root: str | None
    check_png_end: bool
    max_missing_fraction: float = Field(ge=0, le=1)
    report_examples: int = Field(ge=0)
    max_frame_pixels: int = Field(ge=1)


def _under(root: Path, path: str) -> Path:
    return Path(path) if Path(path).is_absolute() else root / path


def empty_table(columns: list[str]) -> pd.DataFrame:
    """A table with the index's columns and dtypes and no rows."""
    dtypes = {"frame": "int64", "index": "int64", **{label: "uint8" for label in LABELS}}
    return pd.DataFrame({c: pd.Series([], dtype=dtypes.get(c, "str")) for c in columns})


# ---------------------------------------------------------------- Galar label CSVs

def _integers(values: pd.Series, csv: Path, column: str) -> np.ndarray:
    numbers = pd.to_numeric(values, errors="coerce")
    bad = numbers.isna() | (numbers != np.round(numbers))
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        value = "" if pd.isna(values.iloc[row]) else str(values.iloc[row])
        raise DataError(f"{csv}: column '{column}', line {row + 2}: "
                         f"value {value!r} is not an integer")
    huge = numbers.abs() >= MAX_FRAME_NUMBER
    if huge.any():
        row = int(np.flatnonzero(huge.to_numpy())[0])
        text = pd.read_csv(csv, usecols=[column], dtype=str, keep_default_na=False)[column].iloc[row]
        raise DataError(f"{csv}: column '{column}', line {row + 2}: value {text!r} "
                         f"is out of range (at most {MAX_FRAME_NUMBER - 1})")
    return numbers.to_numpy().astype(np.int64)


def read_label_csv(csv: Path, report: IndexReport) -> pd.DataFrame:
    """`index`, `frame` (int64) and the 17 labels (uint8) of one Galar label CSV.

    A missing or renamed scored column, a value other than 0/1/empty, a non-integer index or
    frame, or a duplicate frame or index is an error: the labels would be wrong.
    """
    try:
        header = _raw_header(csv)
        twice = sorted({h for h in header if header.count(h) > 1 and h in ("index", "frame", *LABELS)})
        if twice:
            raise DataError(f"{csv}: column '{twice[0]}' appears {header.count(twice[0])} times in "
                            "the header; which one holds the labels is unknowable")
        if len(header) == 1 and header[0].count(";") >= 2:
            raise DataError(f"{csv}: the header is one ';'-separated field; Galar label CSVs "
                            "are comma-separated (re-save it with ',' as the separator)")
        for column in ("index", "frame", *LABELS):
            if column not in header:
                near = difflib.get_close_matches(column, [str(h) for h in header], n=1)
                hint = f" (found '{near[0]}'; scored columns are named exactly as the 17 " \
                       "labels)" if near else ""
                raise DataError(f"{csv}: missing column '{column}'{hint}")
        # Numbers parsed by the C reader; only truly empty cells become NaN.
        table = pd.read_csv(csv, usecols=["index", "frame", *LABELS], keep_default_na=False,
                            na_values=[""])
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise DataError(f"{csv}: not a readable CSV ({err})") from None
    labels = pd.DataFrame({"index": _integers(table["index"], csv, "index"),
                           "frame": _integers(table["frame"], csv, "frame")})
    n_empty = 0
    for label in LABELS:
        empty = table[label].isna()
        numbers = pd.to_numeric(table[label], errors="coerce")
        bad = ~empty & ~numbers.isin([0, 1])
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            text = pd.read_csv(csv, usecols=[label], dtype=str, keep_default_na=False)[label]
            raise DataError(f"{csv}: column '{label}', line {row + 2}: "
                             f"value {text.iloc[row]!r} is not 0, 1 or empty")
        n_empty += int(empty.sum())
        labels[label] = numbers.fillna(0).to_numpy().astype(np.uint8)
    if n_empty:
        report.warn("empty_label_cells", [f"{csv}: {n_empty} empty label cells read as 0"],
                    count=n_empty)
    for column in ("frame", "index"):
        twice = labels[column].duplicated(keep=False).to_numpy()
        if twice.any():
            lines = (np.flatnonzero(twice)[:2] + 2).tolist()
            value = labels[column].iloc[lines[0] - 2]
            raise DataError(f"{csv}: duplicate {column} {value} on lines {lines[0]} and {lines[1]}")
    return labels.sort_values("frame", ignore_index=True)


def _raw_header(csv: Path) -> list[str]:
    """The first line's field names as written (pandas would rename a repeated one 'x.1')."""
    with open(csv, newline="", encoding="utf-8-sig") as f:
        return next(_csv.reader(f), [])


def read_capsules(root: Path, cfg: DataParams, report: IndexReport) -> dict[str, str]:
    """video_id → capsule system from metadata.csv (columns found by name), or {} with a warning."""
    if cfg.metadata is None:
        return {}
    path = _under(root, cfg.metadata)
    if not path.is_file():
        report.warn("metadata", [f"{path}: not found (data.metadata); capsule left empty"])
        return {}
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not a readable CSV ({err})") from None
    names = {c.strip().lower(): c for c in table.columns}
    video = next((names[n] for n in ("video_id", "video", "video id", "id", "recording")
                  if n in names), None)
    capsule = next((c for n, c in names.items() if "capsule" in n or "system" in n
                    or "device" in n), None)
    if video is None or capsule is None:
        report.warn("metadata", [f"{path}: no video id and capsule columns among "
                                 f"{list(table.columns)}; capsule left empty"])
        return {}
    ids = table[video].str.strip().str.extract(GALAR_VIDEO_FOLDER, expand=False)
    return {str(int(i)): c.strip() for i, c in zip(ids, table[capsule]) if isinstance(i, str)}


def check_capsule_coverage(capsules: dict[str, str], videos: list[str], cfg: DataParams,
                           report: IndexReport) -> None:
    """Warn for each indexed video metadata.csv does not list (capsule left empty: a per-device
    analysis would silently lose it) and each listed video the index does not hold (a typo, or a
    metadata file of another copy)."""
    if not capsules:
        return  # no metadata, or none readable: read_capsules said so
    known = set(videos)
    report.warn("metadata_missing_video", [f"{cfg.metadata}: no row for video {v} (data.metadata); capsule left empty"
                                           for v in videos if v not in capsules])
    report.warn("metadata_unknown_video", [f"{cfg.metadata}: lists video {v}, which the index does not hold"
                                           for v in sorted(set(capsules) - known, key=int)])


# ---------------------------------------------------------------- Galar layout

def index_galar_video(video_id: str, folder: Path, csv: Path, root: Path, capsule: str,
                      cfg: DataParams, report: IndexReport) -> pd.DataFrame | None:
    """Rows of one labelled video: frames on disk joined with their label rows."""
    files, others = list_frames(folder, GALAR_FRAME, cfg.check_png_end)
    report.warn("ignored_file", [f"{folder / name}: not a frame file" for name in others])
    if files.empty:
        report.warn("empty_video_folder", [f"{folder}: no frame files; video {video_id} skipped"])
        return None
    labels = read_label_csv(csv, report)
    if labels.empty:
        report.warn("label_csv_without_rows",
                    [f"{csv}: header only, no label rows; video {video_id} ({folder}) skipped"])
        return None
    missing = labels[~labels["frame"].isin(files["frame"])]
    if len(missing) > cfg.max_missing_fraction * len(labels):
        raise DataError(
            f"{folder}: {len(missing)} of {len(labels)} frames listed in {csv} are missing on "
            f"disk (more than data.max_missing_fraction = {cfg.max_missing_fraction}); "
            f"is this the folder of video {video_id}?")
    report.warn("frame_missing_on_disk",
                [f"{csv}: frame {f} (index {i}) listed, but {folder}/frame_{f:06d}.PNG is missing"
                 for f, i in zip(missing["frame"], missing["index"])])
    unlabelled = files[~files["frame"].isin(labels["frame"])]
    report.warn("frame_without_label",
                [f"{folder / name}: frame on disk has no row in {csv}"
                 for name in unlabelled["name"]])
    files = drop_bad_files(files, folder, report, cfg.max_frame_pixels)
    rows = labels.merge(files[["frame", "name"]], on="frame", how="inner", validate="1:1")
    if (np.diff(rows["index"].to_numpy()) <= 0).any():
        report.warn("index_not_increasing", [f"{csv}: index does not increase with frame"])
    rel = folder.relative_to(root).as_posix()
    rows.insert(0, "video_id", video_id)
    rows.insert(3, "path", rel + "/" + rows.pop("name"))
    rows["event_unit"] = "index"
    rows["capsule"] = capsule
    return rows[COLUMNS]


def _video_folders(root: Path, name: re.Pattern, skip: set[Path]) -> list[Path]:
    """Folders named like a video under `root`; a near-miss ('2 ', 'ukdd_navi_00051\\n') is an error."""
    folders = find_folders(root, LOOSE_NAME[name], FOLDER_DEPTH, skip)
    for folder in folders:
        if not name.match(folder.name):
            raise DataError(f"{folder.parent}: folder {folder.name!r} looks like a video folder but has "
                            f"spaces or line breaks in its name; rename it to {folder.name.strip()!r}")
    return folders


def find_galar_videos(root: Path, labels_dir: Path) -> dict[str, Path]:
    """video_id → frame folder; two folders for one id is an error."""
    videos: dict[str, Path] = {}
    skip = {labels_dir.resolve()}
    for folder in _video_folders(root, GALAR_VIDEO_FOLDER, skip):
        video_id = str(int(GALAR_VIDEO_FOLDER.match(folder.name).group(1)))
        if video_id in videos:
            raise DataError(f"two folders for video {video_id}: {videos[video_id]} and {folder}")
        videos[video_id] = folder
    return videos


def index_galar(cfg: DataParams, report: IndexReport) -> pd.DataFrame:
    """The labelled frame index of the Galar layout under `cfg.root`."""
    root = Path(cfg.root)
    if not root.is_dir():
        raise DataError(f"data root not found: {root} (data.root)")
    labels_dir = _under(root, cfg.labels_dir)
    if not labels_dir.is_dir():
        raise DataError(f"label folder not found: {labels_dir} (data.labels_dir)")
    csvs: dict[str, Path] = {}
    for path in sorted(labels_dir.iterdir()):
        if m := GALAR_LABEL_CSV.match(path.name):
            video_id = str(int(m.group(1)))
            if video_id in csvs:
                raise DataError(f"two label CSVs for video {video_id}: {csvs[video_id]} and {path}; "
                                "keep one")
            csvs[video_id] = path
    folders = find_galar_videos(root, labels_dir)
    capsules = read_capsules(root, cfg, report)
    tables = []
    for video_id in sorted(set(csvs) | set(folders), key=int):
        if video_id not in csvs:
            report.warn("video_without_labels", [
                f"{folders[video_id]}: no label CSV {labels_dir}/{video_id}.csv; video skipped"])
        elif video_id not in folders:
            report.warn("labels_without_video", [
                f"{csvs[video_id]}: no frame folder for video {video_id} under {root}; skipped"])
        else:
            tables.append(index_galar_video(video_id, folders[video_id], csvs[video_id], root,
                                            capsules.get(video_id, ""), cfg, report))
    tables = [t for t in tables if t is not None]
    if not tables:
        raise DataError(
            f"{root}: no labelled video found (expected frame folders named by video id, e.g. "
            f"1/ or recording_1/, possibly inside Galar_Frames_*/, and {labels_dir}/<id>.csv)")
    frames = pd.concat(tables, ignore_index=True).sort_values(["video_id", "frame"],
                                                              ignore_index=True)
    check_capsule_coverage(capsules, sorted(frames["video_id"].unique(), key=int), cfg, report)
    report.layouts["galar"] = {
        "root": cfg.root, "labels_dir": cfg.labels_dir,
        "videos": int(frames["video_id"].nunique()), "frames": len(frames),
        "capsules": {k: int(v) for k, v in
                     frames.groupby("video_id")["capsule"].first().value_counts().sort_index().items()},
        "positive_frames": {label: int(frames[label].sum()) for label in LABELS},
    }
    return frames


# ---------------------------------------------------------------- RARE-VISION test layout

def _frame_lists(video_folders: list[Path]) -> dict[str, Path]:
    """video_id → its ';'-separated frame list, found beside the video folders (in their
    parent or one of its non-video subfolders, e.g. `ukdd_navi_00051_00068_00076/`)."""
    lists = {}
    for parent in sorted({folder.parent for folder in video_folders}):
        places = [parent] + [p for p in sorted(parent.iterdir())
                             if p.is_dir() and not TEST_VIDEO_FOLDER.match(p.name)]
        for place in places:
            for path in sorted(place.iterdir()):
                if (m := TEST_LIST_CSV.match(path.name)) and path.is_file():
                    lists[m.group(1)] = path
    return lists


def _listed_frames(csv: Path) -> np.ndarray:
    try:
        table = pd.read_csv(csv, sep=";", dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise DataError(f"{csv}: not a readable ';'-separated CSV ({err})") from None
    if "frame_file" not in table.columns:
        raise DataError(f"{csv}: no 'frame_file' column (expected a ';'-separated frame list)")
    numbers = table["frame_file"].str.strip().str.extract(TEST_FRAME, expand=False)
    return numbers.dropna().astype("int64").to_numpy()


def index_test_video(folder: Path, frame_list: Path | None, root: Path, cfg: DataParams,
                     report: IndexReport) -> pd.DataFrame | None:
    video_id = folder.name
    files, others = list_frames(folder, TEST_FRAME, cfg.check_png_end)
    others = [n for n in others if not (frame_list and folder / n == frame_list)]
    report.warn("ignored_file", [f"{folder / name}: not a frame file" for name in others])
    if files.empty:
        report.warn("empty_video_folder", [f"{folder}: no frame files; video {video_id} skipped"])
        return None
    if frame_list is None:
        report.warn("test_video_without_list", [f"{folder}: no frame list {video_id}.csv found"])
    else:
        listed = _listed_frames(frame_list)
        report.warn("test_frame_missing_on_disk",
                    [f"{frame_list}: frame {f} listed, but not in {folder}"
                     for f in listed[~np.isin(listed, files["frame"])]])
        report.warn("test_frame_not_listed",
                    [f"{folder / n}: not in {frame_list}; kept"
                     for n in files.loc[~files["frame"].isin(listed), "name"]])
    files = drop_bad_files(files, folder, report, cfg.max_frame_pixels)
    gaps = np.flatnonzero(np.diff(files["frame"].to_numpy()) != 1)
    report.warn("test_frames_not_contiguous",
                [f"{folder}: no frames between {files['frame'].iloc[g]} and "
                 f"{files['frame'].iloc[g + 1]}" for g in gaps])
    rel = folder.relative_to(root).as_posix()
    return pd.DataFrame({
        "video_id": video_id, "frame": files["frame"],
        "index": np.arange(len(files), dtype=np.int64), "path": rel + "/" + files["name"],
        "event_unit": "frame", "capsule": "",
    })


def index_test(cfg: DataParams, report: IndexReport) -> pd.DataFrame:
    """The unlabelled frame index of the RARE-VISION test layout (empty if no test_root)."""
    if cfg.test_root is None:
        report.layouts["test"] = {"root": None, "videos": 0, "frames": 0}
        return empty_table(TEST_COLUMNS)
    root = Path(cfg.test_root)
    if not root.is_dir():
        raise DataError(f"test data root not found: {root} (data.test_root)")
    folders = _video_folders(root, TEST_VIDEO_FOLDER, set())
    if not folders:
        raise DataError(f"{root}: no test video folders ukdd_navi_<number>/ (data.test_root)")
    lists = _frame_lists(folders)
    tables = []
    for folder in folders:
        frame_list = lists.get(folder.name)
        if frame_list is None and (folder / f"{folder.name}.csv").is_file():
            frame_list = folder / f"{folder.name}.csv"
        tables.append(index_test_video(folder, frame_list, root, cfg, report))
    tables = [t for t in tables if t is not None]
    test = (pd.concat(tables, ignore_index=True) if tables else empty_table(TEST_COLUMNS))
    test = test.astype({"video_id": "str", "path": "str", "event_unit": "str", "capsule": "str"})
    test = test.sort_values(["video_id", "frame"], ignore_index=True)[TEST_COLUMNS]
    report.layouts["test"] = {"root": cfg.test_root, "videos": int(test["video_id"].nunique()),
                              "frames": len(test)}
    return test


def frames_absent(cfg: DataParams) -> bool:
    """True on a machine without the frames: neither data.root nor data.test_root is a folder here."""
    return not Path(cfg.root).is_dir() and (cfg.test_root is None or not Path(cfg.test_root).is_dir())


def kept_index(cfg: DataParams, frames_path, test_path, report_path) -> str | None:
    """One line saying the index files are kept as they are, or None: list the frame trees.

    Kept only on a machine without the frames (`frames_absent`) whose index files all exist and
    whose report was listed from this very `data` config (root, labels_dir, test_root): the
    outputs another machine listed and `dvc pull` brought here. Anything else lists the trees,
    and a missing root is the usual error naming it.
    """
    paths = [Path(p) for p in (frames_path, test_path, report_path)]
    if not frames_absent(cfg) or not all(p.is_file() for p in paths):
        return None
    try:
        report = json.loads(paths[2].read_text())
        galar, test = report["galar"], report["test"]
        listed = (galar["root"], galar["labels_dir"], test["root"])
    except (ValueError, KeyError, TypeError):
        return None
    if listed != (cfg.root, cfg.labels_dir, cfg.test_root):
        return None
    return (f"index: no frame tree on this machine ({cfg.root} and {cfg.test_root} not found): kept the index "
            f"listed where they are ({galar['frames']} labelled frames of {galar['videos']} videos, "
            f"{test['frames']} test frames; {paths[0]}, {paths[1]}, {paths[2]})")


def build_index(cfg: DataParams) -> tuple[pd.DataFrame, pd.DataFrame, IndexReport]:
    """(labelled frames, test frames, report) for the data described by `cfg`."""
    report = IndexReport(cfg.report_examples)
    frames = index_galar(cfg, report)
    test = index_test(cfg, report)
    return frames, test, report

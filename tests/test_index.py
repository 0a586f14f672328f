"""The frame index on generated trees that mimic the real Galar and RARE-VISION test layouts."""

from __future__ import annotations

import importlib
import json
import re

import cv2
import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT

from vce.core.labels import LABELS
from vce.data.index import COLUMNS, TEST_COLUMNS, DataParams, build_index
from vce.demo.generate import EXTRA_COLUMNS

PNG = cv2.imencode(".png", np.zeros((2, 2, 3), np.uint8))[1].tobytes()
CSV_COLUMNS = ["index", *LABELS, *EXTRA_COLUMNS, "frame"]  # the real order: index, ~29, frame


def write_video(root, folder: str, video_id: str, n: int, step: int = 5, ext: str = "PNG",
                labels_dir: str = "Labels", first: int = 0) -> pd.DataFrame:
    """Frames `<folder>/frame_XXXXXX.<ext>` and `<labels_dir>/<video_id>.csv` of one video."""
    frames = first + step * np.arange(n)
    (root / folder).mkdir(parents=True, exist_ok=True)
    for f in frames:
        (root / folder / f"frame_{f:06d}.{ext}").write_bytes(PNG)
    rng = np.random.default_rng(int(video_id))
    table = pd.DataFrame(0, index=range(n), columns=CSV_COLUMNS)
    table["index"] = np.arange(n)
    table["frame"] = frames
    for label in LABELS + EXTRA_COLUMNS:
        table[label] = (rng.random(n) < 0.3).astype(int)
    (root / labels_dir).mkdir(parents=True, exist_ok=True)
    table.to_csv(root / labels_dir / f"{video_id}.csv", index=False)
    return table


def galar_tree(root) -> dict[str, pd.DataFrame]:
    """Every real naming variant: archive folders, recording_<id>, zero-padded and plain ids,
    upper- and lower-case extensions, a metadata.csv."""
    tables = {
        "1": write_video(root, "Galar_Frames_1_to_10/1", "1", 12),
        "2": write_video(root, "Galar_Frames_1_to_10/recording_2", "2", 10, ext="png", first=3),
        "11": write_video(root, "Galar_Frames_11_to_20/011", "11", 8, step=1),
        "40": write_video(root, "40", "40", 6),
    }
    pd.DataFrame({"video_id": [1, 2, 11, 40],
                  "capsule": ["Olympus", "PillCam SB3", "PillCam SB3", "PillCam COLON2"]}
                 ).to_csv(root / "metadata.csv", index=False)
    return tables


def test_layout(root, names=("ukdd_navi_00051", "ukdd_navi_00068", "ukdd_navi_00076"),
                firsts=(49, 81, 371), n=7) -> None:
    """The RARE-VISION test layout: 7-digit lower-case frames, ';'-separated frame lists."""
    lists = root / "_".join([names[0]] + [v[-5:] for v in names[1:]])
    lists.mkdir(parents=True)
    for name, first in zip(names, firsts):
        (root / name).mkdir()
        files = [f"frame_{f:07d}.png" for f in range(first, first + n)]
        for file in files:
            (root / name / file).write_bytes(PNG)
        table = pd.DataFrame({"frame_file": files, **{label: "" for label in LABELS}})
        table.to_csv(lists / f"{name}.csv", sep=";", index=False)


test_layout.__test__ = False  # a builder, not a test


def params(tmp_path, **overrides) -> DataParams:
    """params.yaml's `data` section pointed at tmp_path (no test set), with overrides."""
    values = yaml.safe_load((ROOT / "params.yaml").read_text())["data"]
    values.update(root=str(tmp_path / "galar"), test_root=None)
    return DataParams(**{**values, **overrides})


@pytest.fixture()
def galar(tmp_path):
    return galar_tree(tmp_path / "galar")


def warnings_of(report) -> dict:
    return report.as_dict()["warnings"]


# ---------------------------------------------------------------- layouts read right

def test_galar_layout_rows_columns_and_values(tmp_path, galar):
    frames, test, report = build_index(params(tmp_path))
    assert list(frames.columns) == COLUMNS
    assert frames["video_id"].unique().tolist() == ["1", "11", "2", "40"]  # sorted as strings
    assert frames.equals(frames.sort_values(["video_id", "frame"], ignore_index=True))
    assert frames["frame"].dtype == np.int64 and frames["index"].dtype == np.int64
    assert all(frames[label].dtype == np.uint8 for label in LABELS)
    assert not set(EXTRA_COLUMNS) & set(frames.columns)
    assert set(frames["event_unit"]) == {"index"}
    by_video = frames.groupby("video_id")
    assert by_video["capsule"].first().to_dict() == {
        "1": "Olympus", "2": "PillCam SB3", "11": "PillCam SB3", "40": "PillCam COLON2"}
    assert frames.loc[frames["video_id"] == "2", "path"].iloc[0] == \
        "Galar_Frames_1_to_10/recording_2/frame_000003.png"
    assert frames.loc[frames["video_id"] == "11", "path"].iloc[-1] == \
        "Galar_Frames_11_to_20/011/frame_000007.PNG"
    for video_id, table in galar.items():
        rows = frames[frames["video_id"] == video_id].reset_index(drop=True)
        assert rows["frame"].tolist() == table["frame"].tolist()
        assert rows["index"].tolist() == table["index"].tolist()
        assert (rows[list(LABELS)].to_numpy() == table[list(LABELS)].to_numpy()).all()
    assert all((tmp_path / "galar" / p).is_file() for p in frames["path"])
    assert list(test.columns) == TEST_COLUMNS and len(test) == 0
    assert report.as_dict()["n_warnings"] == 0
    assert report.layouts["galar"]["videos"] == 4 and report.layouts["galar"]["frames"] == 36


def test_labels_dir_relative_or_absolute(tmp_path):
    root = tmp_path / "galar"
    write_video(root, "Galar_Frames_1_to_10/1", "1", 5, labels_dir="20251215_Labels_Updated")
    for labels_dir in ("20251215_Labels_Updated", str(root / "20251215_Labels_Updated")):
        frames, _, report = build_index(params(tmp_path, labels_dir=labels_dir))
        assert len(frames) == 5
        assert "metadata" in warnings_of(report)  # no metadata.csv here: capsule left empty
        assert set(frames["capsule"]) == {""}


def test_test_layout_ids_frames_and_units(tmp_path, galar):
    test_layout(tmp_path / "Testdata_ICPR_2026_RARE_Challenge")
    _, test, report = build_index(params(
        tmp_path, test_root=str(tmp_path / "Testdata_ICPR_2026_RARE_Challenge")))
    assert list(test.columns) == TEST_COLUMNS
    assert test["video_id"].unique().tolist() == [
        "ukdd_navi_00051", "ukdd_navi_00068", "ukdd_navi_00076"]
    first = test.groupby("video_id")["frame"].min().tolist()
    assert first == [49, 81, 371]
    assert test.groupby("video_id")["index"].apply(list).map(lambda i: i == list(range(7))).all()
    assert test["path"].iloc[0] == "ukdd_navi_00051/frame_0000049.png"
    assert set(test["event_unit"]) == {"frame"}
    assert report.as_dict()["n_warnings"] == 0
    # Pointing at the folder above the unpacked archive finds the same videos and lists.
    _, nested, report = build_index(params(tmp_path, test_root=str(tmp_path)))
    assert nested["path"].iloc[0] == "Testdata_ICPR_2026_RARE_Challenge/ukdd_navi_00051/frame_0000049.png"
    assert nested[["video_id", "frame", "index"]].equals(test[["video_id", "frame", "index"]])
    assert report.as_dict()["n_warnings"] == 0


def test_test_layout_list_problems_are_warnings(tmp_path, galar):
    root = tmp_path / "test"
    test_layout(root, names=("ukdd_navi_00051", "ukdd_navi_00068"), firsts=(49, 81))
    (root / "ukdd_navi_00051" / "frame_0000099.png").write_bytes(PNG)  # unlisted, after a gap
    (root / "ukdd_navi_00068_lists").mkdir()
    (root / "ukdd_navi_00051_00068" / "ukdd_navi_00068.csv").unlink()
    _, test, report = build_index(params(tmp_path, test_root=str(root)))
    warnings = warnings_of(report)
    assert warnings["test_frame_not_listed"]["examples"] == [
        f"{root}/ukdd_navi_00051/frame_0000099.png: not in "
        f"{root}/ukdd_navi_00051_00068/ukdd_navi_00051.csv; kept"]
    assert warnings["test_frames_not_contiguous"]["examples"] == [
        f"{root}/ukdd_navi_00051: no frames between 55 and 99"]
    assert warnings["test_video_without_list"]["examples"] == [
        f"{root}/ukdd_navi_00068: no frame list ukdd_navi_00068.csv found"]
    assert len(test) == 15


# ---------------------------------------------------------------- bad input: warnings

def test_frame_listed_but_missing_on_disk_is_dropped_with_a_warning(tmp_path):
    root = tmp_path / "galar"
    write_video(root, "1", "1", 200)
    (root / "1" / "frame_000050.PNG").unlink()
    frames, _, report = build_index(params(tmp_path))
    assert 50 not in frames["frame"].tolist() and len(frames) == 199
    assert warnings_of(report)["frame_missing_on_disk"]["examples"] == [
        f"{root}/Labels/1.csv: frame 50 (index 10) listed, but {root}/1/frame_000050.PNG is missing"]


def test_many_frames_missing_on_disk_is_an_error(tmp_path):
    root = tmp_path / "galar"
    write_video(root, "1", "1", 20)
    for f in (0, 5, 10):
        (root / "1" / f"frame_{f:06d}.PNG").unlink()
    with pytest.raises(ValueError, match=(
            rf"^{root}/1: 3 of 20 frames listed in {root}/Labels/1.csv are missing on disk "
            r"\(more than data.max_missing_fraction = 0.01\); is this the folder of video 1\?$")):
        build_index(params(tmp_path))


def test_frame_on_disk_without_label_row_is_dropped_with_a_warning(tmp_path):
    root = tmp_path / "galar"
    write_video(root, "1", "1", 6)
    (root / "1" / "frame_000999.PNG").write_bytes(PNG)
    (root / "1" / "Thumbs.db").write_bytes(b"x")
    frames, _, report = build_index(params(tmp_path))
    assert len(frames) == 6
    warnings = warnings_of(report)
    assert warnings["frame_without_label"]["examples"] == [
        f"{root}/1/frame_000999.PNG: frame on disk has no row in {root}/Labels/1.csv"]
    assert warnings["ignored_file"]["examples"] == [f"{root}/1/Thumbs.db: not a frame file"]


def test_empty_and_truncated_pngs_are_dropped_with_warnings(tmp_path):
    root = tmp_path / "galar"
    write_video(root, "1", "1", 6)
    (root / "1" / "frame_000005.PNG").write_bytes(b"")
    (root / "1" / "frame_000010.PNG").write_bytes(PNG[:-12])
    frames, _, report = build_index(params(tmp_path))
    assert frames["frame"].tolist() == [0, 15, 20, 25]
    warnings = warnings_of(report)
    assert warnings["empty_frame_file"]["examples"] == [
        f"{root}/1/frame_000005.PNG: empty file (0 bytes)"]
    assert warnings["truncated_frame_file"]["examples"] == [
        f"{root}/1/frame_000010.PNG: truncated PNG (no IEND chunk at the end)"]
    assert "frame_missing_on_disk" not in warnings
    # Without the end check a truncated file is left to decode-time handling.
    frames, _, _ = build_index(params(tmp_path, check_png_end=False))
    assert frames["frame"].tolist() == [0, 10, 15, 20, 25]


def test_video_without_labels_and_labels_without_video_are_skipped(tmp_path):
    root = tmp_path / "galar"
    write_video(root, "1", "1", 4)
    write_video(root, "Galar_Frames_1_to_10/2", "2", 4)
    (root / "Labels" / "2.csv").rename(root / "Labels" / "3.csv")
    frames, _, report = build_index(params(tmp_path))
    assert frames["video_id"].unique().tolist() == ["1"]
    warnings = warnings_of(report)
    assert warnings["video_without_labels"]["examples"] == [
        f"{root}/Galar_Frames_1_to_10/2: no label CSV {root}/Labels/2.csv; video skipped"]
    assert warnings["labels_without_video"]["examples"] == [
        f"{root}/Labels/3.csv: no frame folder for video 3 under {root}; skipped"]


def test_empty_video_folder_is_skipped_with_a_warning(tmp_path):
    root = tmp_path / "galar"
    write_video(root, "1", "1", 4)
    write_video(root, "2", "2", 4)
    for file in (root / "2").iterdir():
        file.unlink()
    frames, _, report = build_index(params(tmp_path))
    assert frames["video_id"].unique().tolist() == ["1"]
    assert warnings_of(report)["empty_video_folder"]["examples"] == [
        f"{root}/2: no frame files; video 2 skipped"]


def test_empty_label_cells_read_as_zero_with_a_warning(tmp_path):
    root = tmp_path / "galar"
    table = write_video(root, "1", "1", 4)
    table["blood"] = table["blood"].astype(object)
    table.loc[1, "blood"] = ""
    table.loc[2, "polyp"] = 1
    table.to_csv(root / "Labels" / "1.csv", index=False)
    frames, _, report = build_index(params(tmp_path))
    assert frames["blood"].iloc[1] == 0 and frames["polyp"].iloc[2] == 1
    assert warnings_of(report)["empty_label_cells"]["count"] == 1


# ---------------------------------------------------------------- bad input: errors

def test_missing_data_root_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=rf"^data root not found: {tmp_path}/nowhere \(data.root\)$"):
        build_index(params(tmp_path, root=str(tmp_path / "nowhere")))


def test_missing_label_folder_and_test_root_are_errors(tmp_path, galar):
    with pytest.raises(ValueError, match=r"^label folder not found: .*/galar/Updated \(data.labels_dir\)$"):
        build_index(params(tmp_path, labels_dir="Updated"))
    with pytest.raises(ValueError, match=r"^test data root not found: .*/none \(data.test_root\)$"):
        build_index(params(tmp_path, test_root=str(tmp_path / "none")))


def test_renamed_scored_column_is_an_error_naming_file_and_column(tmp_path):
    root = tmp_path / "galar"
    table = write_video(root, "1", "1", 4)
    table.rename(columns={"lymphangioectasis": "lymphangiectasia"}).to_csv(
        root / "Labels" / "1.csv", index=False)
    with pytest.raises(ValueError, match=(
            rf"^{root}/Labels/1.csv: missing column 'lymphangioectasis' "
            r"\(found 'lymphangiectasia'; scored columns are named exactly as the 17 labels\)$")):
        build_index(params(tmp_path))


@pytest.mark.parametrize("value", ["2", "x", "-1", "0.5"])
def test_label_value_other_than_0_1_or_empty_is_an_error(tmp_path, value):
    root = tmp_path / "galar"
    table = write_video(root, "1", "1", 4).astype(object)
    table.loc[2, "ulcer"] = value
    table.to_csv(root / "Labels" / "1.csv", index=False)
    with pytest.raises(ValueError, match=(
            rf"^{root}/Labels/1.csv: column 'ulcer', line 4: value '{value}' is not 0, 1 or empty$")):
        build_index(params(tmp_path))


def test_duplicate_frame_numbers_are_errors(tmp_path):
    root = tmp_path / "galar"
    table = write_video(root, "1", "1", 4)
    (root / "1" / "frame_5.PNG").write_bytes(PNG)  # same number as frame_000005.PNG
    with pytest.raises(ValueError, match=(
            rf"^{root}/1: duplicate frame number 5: frame_000005.PNG, frame_5.PNG$")):
        build_index(params(tmp_path))
    (root / "1" / "frame_5.PNG").unlink()
    table.loc[3, "frame"] = 5
    table.to_csv(root / "Labels" / "1.csv", index=False)
    with pytest.raises(ValueError, match=rf"^{root}/Labels/1.csv: duplicate frame 5 on lines 3 and 5$"):
        build_index(params(tmp_path))
    table.loc[3, "frame"], table.loc[3, "index"] = 15, 0
    table.to_csv(root / "Labels" / "1.csv", index=False)
    with pytest.raises(ValueError, match=rf"^{root}/Labels/1.csv: duplicate index 0 on lines 2 and 5$"):
        build_index(params(tmp_path))


def test_non_integer_frame_is_an_error(tmp_path):
    root = tmp_path / "galar"
    table = write_video(root, "1", "1", 4).astype(object)
    table.loc[1, "frame"] = ""
    table.to_csv(root / "Labels" / "1.csv", index=False)
    with pytest.raises(ValueError, match=(
            rf"^{root}/Labels/1.csv: column 'frame', line 3: value '' is not an integer$")):
        build_index(params(tmp_path))


def test_two_folders_for_one_video_is_an_error(tmp_path):
    root = tmp_path / "galar"
    write_video(root, "Galar_Frames_1_to_10/1", "1", 3)
    write_video(root, "recording_1", "1", 3)
    with pytest.raises(ValueError, match=r"^two folders for video 1: .*/1 and .*/recording_1$"):
        build_index(params(tmp_path))


def test_no_video_at_all_is_an_error(tmp_path):
    (tmp_path / "galar" / "Labels").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"no labelled video found"):
        build_index(params(tmp_path))


# ---------------------------------------------------------------- the stage

def load_stage():
    return importlib.import_module("stages.index")


def stage_paths(tmp_path, **data) -> list[str]:
    full = yaml.safe_load((ROOT / "params.yaml").read_text())
    full["data"].update({"root": str(tmp_path / "galar"), "test_root": str(tmp_path / "test"), **data})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(full))
    return ["--params", str(tmp_path / "params.yaml"),
            "--frames-out", str(tmp_path / "out/frames.parquet"),
            "--test-out", str(tmp_path / "out/test.parquet"),
            "--report", str(tmp_path / "out/report.json")]


def test_stage_writes_three_outputs_deterministically(tmp_path, galar):
    test_layout(tmp_path / "test")
    (tmp_path / "galar" / "40" / "frame_000005.PNG").write_bytes(b"")
    stage = load_stage()
    assert stage.main(stage_paths(tmp_path)) == 0
    first = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert set(first) == {"frames.parquet", "test.parquet", "report.json"}
    report = json.loads(first["report.json"])
    assert report["galar"]["frames"] == 35 and report["test"]["frames"] == 21
    assert report["warnings"]["empty_frame_file"]["count"] == 1
    assert stage.main(stage_paths(tmp_path)) == 0
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == first


def test_stage_error_exits_2_with_message_and_writes_nothing(tmp_path, capsys):
    stage = load_stage()
    assert stage.main(stage_paths(tmp_path, root=str(tmp_path / "missing"))) == 2
    assert capsys.readouterr().err == f"error: data root not found: {tmp_path}/missing (data.root)\n"
    assert not (tmp_path / "out").exists()
    assert stage.main(stage_paths(tmp_path, check_png_end="yes")) == 2
    assert "data.check_png_end = 'yes': must be true or false" in capsys.readouterr().err


def test_without_the_frame_trees_the_stage_keeps_the_index_it_was_given(tmp_path, galar, capsys):
    """Issue 50: a machine that pulled the index but has no frames keeps it byte for byte (DVC runs
    the stage on every repro); only the index listed from this very data config, only with no tree."""
    import shutil

    test_layout(tmp_path / "test")
    stage = load_stage()
    assert stage.main(stage_paths(tmp_path)) == 0
    listed = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    shutil.move(tmp_path / "galar", tmp_path / "galar.away")
    assert stage.main(stage_paths(tmp_path)) == 2  # a test tree is here: list it, and the missing root is an error
    assert capsys.readouterr().err == f"error: data root not found: {tmp_path}/galar (data.root)\n"
    shutil.move(tmp_path / "test", tmp_path / "test.away")
    assert stage.main(stage_paths(tmp_path)) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"index: no frame tree on this machine ({tmp_path}/galar and {tmp_path}/test not found): "
                          "kept the index listed where they are (36 labelled frames of 4 videos, 21 test frames;")
    assert len(err.splitlines()) == 1 and {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == listed
    # Another data config than the one the index was listed from: not kept, the usual error.
    assert stage.main(stage_paths(tmp_path, labels_dir="Updated")) == 2
    assert capsys.readouterr().err == f"error: data root not found: {tmp_path}/galar (data.root)\n"
    shutil.move(tmp_path / "galar.away", tmp_path / "galar")  # the frames back: listed again
    (tmp_path / "galar" / "Labels" / "40.csv").unlink()
    assert stage.main(stage_paths(tmp_path, test_root=None)) == 0
    assert json.loads((tmp_path / "out/report.json").read_text())["galar"]["videos"] == 3


# ---------------------------------------------------------------- hostile files (issue 20)

def test_two_label_csvs_for_one_video_is_an_error_naming_both(tmp_path):
    root = tmp_path / "galar"
    write_video(root, "1", "1", 4)
    (root / "Labels" / "01.csv").write_text((root / "Labels" / "1.csv").read_text())
    with pytest.raises(ValueError, match=(
            rf"^two label CSVs for video 1: {root}/Labels/01.csv and {root}/Labels/1.csv; keep one$")):
        build_index(params(tmp_path))


def test_a_label_column_written_twice_is_an_error_naming_file_and_column(tmp_path):
    root = tmp_path / "galar"
    table = write_video(root, "1", "1", 4)
    lines = (root / "Labels" / "1.csv").read_text().splitlines()
    lines = [lines[0] + ",blood"] + [line + ",1" for line in lines[1:]]
    (root / "Labels" / "1.csv").write_text("\n".join(lines) + "\n")
    assert table["blood"].sum() < 4  # the second column (all 1) would change the labels
    with pytest.raises(ValueError, match=rf"^{root}/Labels/1.csv: column 'blood' appears 2 times"):
        build_index(params(tmp_path))


def test_a_semicolon_separated_label_csv_names_the_separator(tmp_path):
    root = tmp_path / "galar"
    table = write_video(root, "1", "1", 4)
    table.to_csv(root / "Labels" / "1.csv", sep=";", index=False)
    with pytest.raises(ValueError, match=rf"^{root}/Labels/1.csv: the header is one ';'-separated field"):
        build_index(params(tmp_path))


def test_a_header_only_label_csv_skips_its_video_with_a_warning_naming_it(tmp_path):
    root = tmp_path / "galar"
    write_video(root, "1", "1", 4)
    table = write_video(root, "2", "2", 3)
    table.iloc[:0].to_csv(root / "Labels" / "2.csv", index=False)
    frames, _, report = build_index(params(tmp_path))
    assert frames["video_id"].unique().tolist() == ["1"]
    assert warnings_of(report)["label_csv_without_rows"]["examples"] == [
        f"{root}/Labels/2.csv: header only, no label rows; video 2 ({root}/2) skipped"]
    assert "frame_without_label" not in warnings_of(report)


def test_a_frame_number_past_int64_is_an_error_naming_file_and_line(tmp_path):
    root = tmp_path / "galar"
    table = write_video(root, "1", "1", 4).astype(object)
    table.loc[2, "frame"] = "1e20"
    table.to_csv(root / "Labels" / "1.csv", index=False)
    with pytest.raises(ValueError, match=rf"^{root}/Labels/1.csv: column 'frame', line 4: value '1e20' is out of range"):
        build_index(params(tmp_path))


@pytest.mark.parametrize("name", ["2 ", " 2", "recording_2\n"])
def test_a_galar_folder_with_spaces_in_its_name_is_named(tmp_path, name):
    root = tmp_path / "galar"
    write_video(root, "1", "1", 4)
    write_video(root, name, "2", 4)
    with pytest.raises(ValueError, match=rf"folder {re.escape(repr(name))} looks like a video folder.*"
                                         rf"rename it to {re.escape(repr(name.strip()))}$"):
        build_index(params(tmp_path))


def test_a_test_folder_with_a_trailing_newline_is_named_not_written_into_the_submission(tmp_path, galar):
    test_layout(tmp_path / "test", names=("ukdd_navi_00051\n", "ukdd_navi_00068", "ukdd_navi_00076"))
    with pytest.raises(ValueError, match=r"folder 'ukdd_navi_00051\\n' looks like a video folder"):
        build_index(params(tmp_path, test_root=str(tmp_path / "test")))


def png_header_claiming(width: int, height: int) -> bytes:
    """A small file whose PNG header declares width × height (a decompression bomb's shape)."""
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    idat = zlib.compress(b"\0" * 1000)
    data = struct.pack(">I", len(idat)) + b"IDAT" + idat + struct.pack(">I", zlib.crc32(b"IDAT" + idat))
    return b"\x89PNG\r\n\x1a\n" + chunk + data + b"\x00\x00\x00\x00IEND\xaeB`\x82"


def test_frame_files_by_content_jpeg_kept_non_image_and_oversized_dropped(tmp_path):
    root = tmp_path / "galar"
    write_video(root, "1", "1", 6)
    jpeg = cv2.imencode(".jpg", np.zeros((2, 2, 3), np.uint8))[1].tobytes()
    (root / "1" / "frame_000005.PNG").write_bytes(jpeg)
    (root / "1" / "frame_000010.PNG").write_bytes(b"GIF89a" + b"\0" * 40)
    (root / "1" / "frame_000015.PNG").write_bytes(png_header_claiming(60000, 60000))
    (root / "1" / "frame_000020.PNG").write_bytes(jpeg[:-2])
    frames, _, report = build_index(params(tmp_path, max_frame_pixels=1000 * 1000))
    assert frames["frame"].tolist() == [0, 5, 25]
    warnings = warnings_of(report)
    assert warnings["not_png_frame_file"]["examples"] == [
        f"{root}/1/frame_000005.PNG: a JPEG file named .png; kept, decoded as JPEG"]
    assert warnings["not_an_image_file"]["examples"] == [
        f"{root}/1/frame_000010.PNG: neither PNG nor JPEG (starts with b'GIF89a\\x00\\x00')"]
    assert warnings["oversized_frame_file"]["examples"] == [
        f"{root}/1/frame_000015.PNG: 3,600,000,000 pixels in its header, over data.max_frame_pixels = 1,000,000"]
    assert warnings["truncated_frame_file"]["examples"] == [
        f"{root}/1/frame_000020.PNG: truncated JPEG (no end marker)"]
    # The limit is a knob: at 4e9 pixels the 60000² header passes the index (decode time decides).
    frames, _, _ = build_index(params(tmp_path, max_frame_pixels=4 * 10**9))
    assert 15 in frames["frame"].tolist()


def test_metadata_missing_a_video_or_listing_an_unknown_one_is_a_warning_naming_it(tmp_path, galar):
    root = tmp_path / "galar"
    _, _, report = build_index(params(tmp_path))
    assert not {"metadata_missing_video", "metadata_unknown_video"} & set(warnings_of(report))  # full coverage
    pd.DataFrame({"video_id": [1, 2, 11, 77], "capsule": ["Olympus", "PillCam SB3", "PillCam SB3", "Olympus"]}
                 ).to_csv(root / "metadata.csv", index=False)
    frames, _, report = build_index(params(tmp_path))
    warnings = warnings_of(report)
    assert warnings["metadata_missing_video"]["count"] == 1
    assert "no row for video 40" in warnings["metadata_missing_video"]["examples"][0]
    assert warnings["metadata_unknown_video"]["count"] == 1
    assert "lists video 77" in warnings["metadata_unknown_video"]["examples"][0]
    assert frames.loc[frames["video_id"] == "40", "capsule"].eq("").all()


# ---------------------------------------------------------------- issue 48: untested rules

@pytest.mark.parametrize("value", ["2.5", "7.25"])
def test_a_fractional_frame_is_an_error_not_truncated(tmp_path, value):
    """'2.5' must not become frame 2 silently. Mutation killed: dropping the round check."""
    root = tmp_path / "galar"
    table = write_video(root, "1", "1", 4).astype(object)
    table.loc[1, "frame"] = value
    table.to_csv(root / "Labels" / "1.csv", index=False)
    with pytest.raises(ValueError, match=rf"^{root}/Labels/1.csv: column 'frame', line 3: value '{value}' is not an integer$"):
        build_index(params(tmp_path))


def test_max_missing_fraction_is_the_largest_fraction_still_allowed(tmp_path):
    """200 listed frames at 0.01: 2 missing is a warning, 3 an error. Mutations killed: `>=`
    (2 an error), a fraction of the files on disk instead of the listed frames."""
    root = tmp_path / "galar"
    write_video(root, "1", "1", 200)
    for f in (0, 5):
        (root / "1" / f"frame_{f:06d}.PNG").unlink()
    frames, _, report = build_index(params(tmp_path))
    assert len(frames) == 198 and warnings_of(report)["frame_missing_on_disk"]["count"] == 2
    (root / "1" / "frame_000010.PNG").unlink()
    with pytest.raises(ValueError, match=r"3 of 200 frames listed .* missing on disk"):
        build_index(params(tmp_path))


@pytest.mark.parametrize("index", [[0, 1, 2, 3], [0, 2, 1, 3], [0, 1, 1, 2]])
def test_an_index_that_does_not_increase_with_frame_is_a_warning_naming_the_csv(tmp_path, index):
    """The official truth is built in `index` units: an index out of frame order (or repeated)
    misplaces events; a repeated one is refused as a duplicate first. Mutation killed: no warning."""
    root = tmp_path / "galar"
    table = write_video(root, "1", "1", 4)
    table["index"] = index
    table.to_csv(root / "Labels" / "1.csv", index=False)
    if len(set(index)) < len(index):  # a repeated index is an error of its own (duplicates)
        with pytest.raises(ValueError, match="index"):
            build_index(params(tmp_path))
        return
    _, _, report = build_index(params(tmp_path))
    found = warnings_of(report).get("index_not_increasing")
    if index == sorted(index):
        assert found is None
    else:
        assert found["examples"] == [f"{root}/Labels/1.csv: index does not increase with frame"]

"""Tables handed on whole or not at all: staged writes, the completion marker, refusing user folders."""

import bz2
import json

import pytest

from workflows.common import USER_ERRORS
from xh.tables import (
    MARKER,
    ForeignFolderError,
    IncompleteTableError,
    read_marker,
    require_complete,
    staged,
)
from xh.wiki import process


def _write_table(folder, rows: int, tag: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "part-00000.parquet").write_text(f"{tag}:{rows}")


def test_a_staged_table_appears_whole_with_its_marker(tmp_path):
    target = tmp_path / "graphs"
    with staged(str(target), inputs={"q": "a.json"}) as stage:
        _write_table(tmp_path / stage.uri, 3, "new")
        assert not target.exists()  # nothing handed on while it is being written
        stage.rows = 3
    marker = require_complete(str(target))
    assert marker["rows"] == 3 and marker["written_at"] and len(marker["inputs"]) == 16
    assert (target / "part-00000.parquet").read_text() == "new:3"
    assert [p.name for p in tmp_path.iterdir()] == ["graphs"]  # no staging folder left behind


def test_a_run_that_fails_midway_leaves_the_previous_table_and_its_marker(tmp_path):
    target = tmp_path / "tables"
    with staged(str(target)) as stage:
        _write_table(tmp_path / stage.uri, 2000, "old")
        stage.rows = 2000
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    with pytest.raises(RuntimeError, match="killed"), staged(str(target)) as stage:
        _write_table(tmp_path / stage.uri, 1500, "new")
        raise RuntimeError("killed midway")
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert read_marker(str(target))["rows"] == 2000
    assert [p.name for p in tmp_path.iterdir()] == ["tables"]


def test_a_folder_without_a_marker_is_refused_in_one_line(tmp_path):
    _write_table(tmp_path / "graphs", 25, "partial")
    with pytest.raises(IncompleteTableError) as error:
        require_complete(str(tmp_path / "graphs"), what="graphs", hint=" (run `xh graphs build` first)")
    assert "\n" not in str(error.value) and MARKER in str(error.value)
    assert isinstance(error.value, USER_ERRORS)  # drivers print it and exit 2
    with pytest.raises(IncompleteTableError, match="no graphs at"):
        require_complete(str(tmp_path / "nothing"), what="graphs")


def test_an_output_folder_holding_user_files_is_never_deleted(tmp_path):
    user = tmp_path / "thesis"
    user.mkdir()
    (user / "chapter1.tex").write_text("precious")
    with pytest.raises(ForeignFolderError) as error, staged(str(user)) as stage:
        pytest.fail(f"the run started writing to {stage.uri}")
    assert "\n" not in str(error.value) and "refusing" in str(error.value)
    assert isinstance(error.value, USER_ERRORS)
    assert (user / "chapter1.tex").read_text() == "precious"
    # an empty folder, or one the project marked, is replaced
    (tmp_path / "empty").mkdir()
    with staged(str(tmp_path / "empty")) as stage:
        stage.rows = 0
    assert read_marker(str(tmp_path / "empty"))["rows"] == 0


def _hotpot_dump(folder, titles):
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"id": str(i), "title": t, "text": [f"{t} is a page."], "text_with_links": [f"{t} is a page."]})
        for i, t in enumerate(titles)
    ]
    (folder / "wiki_00.bz2").write_bytes(bz2.compress("\n".join(lines).encode()))
    return [str(folder / "wiki_00.bz2")]


def test_wiki_processing_killed_midway_leaves_the_previous_tables(tmp_path, monkeypatch):
    out = str(tmp_path / "tables")
    first = process.process_in_process("hotpot", _hotpot_dump(tmp_path / "a", ["Alpha", "Beta"]), out, partitions=2)
    assert require_complete(out)["rows"] == first["docs"] == 2
    before = {p: p.read_bytes() for p in (tmp_path / "tables").rglob("*") if p.is_file()}

    def killed(*args, **kwargs):
        raise RuntimeError("worker killed")

    monkeypatch.setattr(process, "resolve_links", killed)
    files = _hotpot_dump(tmp_path / "b", ["Gamma", "Delta", "Epsilon"])
    with pytest.raises(RuntimeError, match="worker killed"):
        process.process_in_process("hotpot", files, out, partitions=2)
    assert {p: p.read_bytes() for p in (tmp_path / "tables").rglob("*") if p.is_file()} == before
    assert require_complete(out)["rows"] == 2

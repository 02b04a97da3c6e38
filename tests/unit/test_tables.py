"""Tables handed on whole or not at all: staged writes, the completion marker, refusing user folders; a batch
job's resumable stages on the same marker."""

import bz2
import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest

from workflows.cli import USER_ERRORS
from xh.stages import wiki
from xh.storage.store import Store, located
from xh.storage.tables import (
    BATCH_STAGE,
    BATCH_STAGING,
    GRAPHS,
    MARKER,
    OWNER,
    WIKI_TABLES,
    ForeignFolderError,
    IncompleteTableError,
    Stages,
    fingerprint,
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
    with staged(located(target), kind=GRAPHS, inputs={"q": "a.json"}) as stage:
        _write_table(tmp_path / stage.uri, 3, "new")
        assert not target.exists()  # nothing handed on while it is being written
        stage.rows = 3
    marker = require_complete(located(target))
    assert marker["rows"] == 3 and marker["written_at"] and len(marker["inputs"]) == 16
    assert (target / "part-00000.parquet").read_text() == "new:3"
    assert [p.name for p in tmp_path.iterdir()] == ["graphs"]  # no staging folder left behind


def test_a_run_that_fails_midway_leaves_the_previous_table_and_its_marker(tmp_path):
    target = tmp_path / "tables"
    with staged(located(target), kind=GRAPHS) as stage:
        _write_table(tmp_path / stage.uri, 2000, "old")
        stage.rows = 2000
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    with pytest.raises(RuntimeError, match="killed"), staged(located(target), kind=GRAPHS) as stage:
        _write_table(tmp_path / stage.uri, 1500, "new")
        raise RuntimeError("killed midway")
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert read_marker(located(target))["rows"] == 2000
    assert [p.name for p in tmp_path.iterdir()] == ["tables"]


def test_a_folder_without_a_marker_is_refused_in_one_line(tmp_path):
    _write_table(tmp_path / "graphs", 25, "partial")
    with pytest.raises(IncompleteTableError) as error:
        require_complete(located(tmp_path / "graphs"), what="graphs", hint=" (run `xh graphs build` first)")
    assert "\n" not in str(error.value) and MARKER in str(error.value)
    assert isinstance(error.value, USER_ERRORS)  # drivers print it and exit 2
    with pytest.raises(IncompleteTableError, match="no graphs at"):
        require_complete(located(tmp_path / "nothing"), what="graphs")


def test_an_output_folder_holding_user_files_is_never_deleted(tmp_path):
    user = tmp_path / "thesis"
    user.mkdir()
    (user / "chapter1.tex").write_text("precious")
    with pytest.raises(ForeignFolderError) as error, staged(located(user), kind=GRAPHS) as stage:
        pytest.fail(f"the run started writing to {stage.uri}")
    assert "\n" not in str(error.value) and "refusing" in str(error.value)
    assert isinstance(error.value, USER_ERRORS)
    assert (user / "chapter1.tex").read_text() == "precious"
    # an empty folder, or one the project marked, is replaced
    (tmp_path / "empty").mkdir()
    with staged(located(tmp_path / "empty"), kind=GRAPHS) as stage:
        stage.rows = 0
    assert read_marker(located(tmp_path / "empty"))["rows"] == 0


def _hotpot_dump(folder, titles):
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"id": str(i), "title": t, "text": [f"{t} is a page."], "text_with_links": [f"{t} is a page."]})
        for i, t in enumerate(titles)
    ]
    (folder / "wiki_00.bz2").write_bytes(bz2.compress("\n".join(lines).encode()))
    return [Store().at(str(folder / "wiki_00.bz2"))]


def test_wiki_processing_killed_midway_leaves_the_previous_tables(tmp_path, monkeypatch):
    out = str(tmp_path / "tables")
    first = wiki.write_tables(
        Store().at(out), _hotpot_dump(tmp_path / "a", ["Alpha", "Beta"]), "hotpot", partitions=2, local=True
    )
    assert require_complete(located(out))["rows"] == first["docs"] == 2
    before = {p: p.read_bytes() for p in (tmp_path / "tables").rglob("*") if p.is_file()}

    def killed(*args, **kwargs):
        raise RuntimeError("worker killed")

    monkeypatch.setattr(process, "resolve_links", killed)
    files = _hotpot_dump(tmp_path / "b", ["Gamma", "Delta", "Epsilon"])
    with pytest.raises(RuntimeError, match="worker killed"):
        wiki.write_tables(Store().at(out), files, "hotpot", partitions=2, local=True)
    assert {p: p.read_bytes() for p in (tmp_path / "tables").rglob("*") if p.is_file()} == before
    assert require_complete(located(out))["rows"] == 2


def _wiki_tables(tmp_path) -> tuple[str, dict]:
    """Real wiki tables at <tmp>/tables, and their files' bytes."""
    out = str(tmp_path / "tables")
    wiki.write_tables(
        Store().at(out), _hotpot_dump(tmp_path / "dump", ["Alpha", "Beta"]), "hotpot", partitions=2, local=True
    )
    return out, _files(tmp_path / "tables")


def _files(folder) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_the_marker_names_its_table_kind_and_stage(tmp_path):
    out, _ = _wiki_tables(tmp_path)
    marker = require_complete(located(out))
    assert marker["kind"] == WIKI_TABLES and marker["stage"] == "wiki"
    assert not (tmp_path / "tables" / OWNER).exists()  # the staging proof does not travel with the table


def test_an_output_pointed_at_another_kind_of_table_is_refused_and_the_table_kept(tmp_path):
    out, before = _wiki_tables(tmp_path)
    with pytest.raises(ForeignFolderError) as error, staged(located(out), kind=GRAPHS, stage="graphs") as stage:
        pytest.fail(f"the run started writing to {stage.uri}")
    message = str(error.value)
    assert "\n" not in message and "wiki tables" in message and "refusing" in message
    assert _files(tmp_path / "tables") == before
    # a table of its own kind is replaced as before
    wiki.write_tables(Store().at(out), _hotpot_dump(tmp_path / "b", ["Gamma"]), "hotpot", partitions=2, local=True)
    assert require_complete(located(out))["rows"] == 1


def test_an_output_inside_another_table_or_over_an_unknown_kind_is_refused(tmp_path):
    out, before = _wiki_tables(tmp_path)
    with (
        pytest.raises(ForeignFolderError, match=r"lies inside the wiki tables of `wiki`"),
        staged(located(f"{out}/graphs"), kind=GRAPHS),
    ):
        pytest.fail("started writing inside the wiki tables")
    assert _files(tmp_path / "tables") == before
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "notes.parquet").write_text("old")
    (legacy / MARKER).write_text(json.dumps({"rows": 3, "written_at": "2026-01-01T00:00:00Z", "inputs": "x"}))
    with pytest.raises(ForeignFolderError, match="names no kind"), staged(located(legacy), kind=GRAPHS):
        pytest.fail("replaced a table of unknown kind")
    assert (legacy / "notes.parquet").read_text() == "old"


def test_tables_marked_before_markers_named_kinds_are_known_by_their_layout(tmp_path):
    out, _ = _wiki_tables(tmp_path)
    marker = json.loads((tmp_path / "tables" / MARKER).read_text())
    (tmp_path / "tables" / MARKER).write_text(
        json.dumps({k: v for k, v in marker.items() if k not in ("kind", "stage")})
    )
    before = _files(tmp_path / "tables")
    with pytest.raises(ForeignFolderError, match="names no kind"), staged(located(out), kind=GRAPHS):
        pytest.fail("replaced older wiki tables with graphs")
    assert _files(tmp_path / "tables") == before
    wiki.write_tables(
        Store().at(out), _hotpot_dump(tmp_path / "b", ["Gamma"]), "hotpot", partitions=2, local=True
    )  # wiki: its own
    assert require_complete(located(out))["kind"] == WIKI_TABLES


def test_the_graphs_stage_pointed_at_the_wiki_tables_exits_2_in_one_line_and_keeps_them(tmp_path):
    """The issue's probe: `graphs.output=<root>/tables` replaced the wiki tables with one graphs file, exit 0."""
    out, before = _wiki_tables(tmp_path)
    questions = tmp_path / "questions.json"
    questions.write_text("[]")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "workflows.cli",
            "graphs",
            "build",
            "--set",
            f"storage.root={tmp_path}",
            "--set",
            f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            "--set",
            "graphs.setting=distractor",
            "--set",
            f"graphs.questions={questions}",
            "--set",
            f"graphs.output={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RAY_TMPDIR": str(tmp_path / "ray")},
    )
    assert result.returncode == 2, result.stderr
    # (MLflow's own lines about creating its database may come first: the error is one line, no traceback)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "wiki tables" in errors[0] and "Traceback" not in result.stderr, result.stderr
    assert _files(tmp_path / "tables") == before


def test_a_staging_sibling_the_project_did_not_write_is_refused_and_kept(tmp_path):
    target = tmp_path / "graphs"
    foreign = tmp_path / ".graphs.staging"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ForeignFolderError) as error, staged(located(target), kind=GRAPHS):
        pytest.fail("started over a foreign staging folder")
    assert "\n" not in str(error.value) and OWNER in str(error.value)
    assert (foreign / "notes.txt").read_text() == "mine"
    # a leftover of a killed run of this kind carries its proof and is cleared
    (foreign / "notes.txt").unlink()
    (foreign / OWNER).write_text(json.dumps({"kind": GRAPHS, "target": str(target)}))
    (foreign / "part-00000.parquet").write_text("half")
    with staged(located(target), kind=GRAPHS) as stage:
        assert not (tmp_path / stage.uri / "part-00000.parquet").exists()
        stage.rows = 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graphs"]
    # one of another kind (or for another target) is not ours to delete
    foreign.mkdir()
    (foreign / OWNER).write_text(json.dumps({"kind": WIKI_TABLES, "target": str(target)}))
    with pytest.raises(ForeignFolderError), staged(located(target), kind=GRAPHS):
        pytest.fail("deleted another kind's staging folder")
    assert (foreign / OWNER).exists()


def test_an_old_sibling_is_deleted_only_with_our_marker_and_restored_after_a_kill_between_renames(tmp_path):
    target, old = tmp_path / "graphs", tmp_path / ".graphs.old"
    old.mkdir()
    (old / "notes.txt").write_text("mine")
    with pytest.raises(ForeignFolderError, match="refusing to delete"), staged(located(target), kind=GRAPHS):
        pytest.fail("started over a foreign .old folder")
    assert (old / "notes.txt").read_text() == "mine"
    (old / "notes.txt").unlink()
    old.rmdir()

    with staged(located(target), kind=GRAPHS) as stage:
        _write_table(tmp_path / stage.uri, 5, "first")
        stage.rows = 5
    target.rename(old)  # killed after renaming the table aside, before renaming the new one in
    with pytest.raises(RuntimeError, match="killed"), staged(located(target), kind=GRAPHS):
        raise RuntimeError("killed again")
    assert (target / "part-00000.parquet").read_text() == "first:5" and read_marker(located(target))["rows"] == 5
    assert not old.exists()


# --- a batch job's resumable stages ----------------------------------------------------------------


def _finish(staging, name: str) -> None:
    os.makedirs(staging / name, exist_ok=True)
    (staging / name / MARKER).write_text(json.dumps({"kind": BATCH_STAGE, "stage": name}))


def test_staging_of_the_same_fingerprint_is_resumed_and_staging_of_another_is_discarded(tmp_path):
    staging = tmp_path / "staging"
    first = Stages(Store().at(str(staging)), fingerprint="aaa", run_id="r1")
    assert not first.discarded
    owner = {"kind": BATCH_STAGING, "fingerprint": "aaa", "run_id": "r1"}
    assert json.loads((staging / OWNER).read_text()) == owner  # the staging is run r1's
    _finish(staging, "parse")
    os.makedirs(staging / "graphs")  # a stage killed before its marker: written again, not resumed
    (staging / "graphs" / "part-0.parquet").write_text("half")

    same = Stages(Store().at(str(staging)), fingerprint="aaa", run_id="r2")
    assert json.loads((staging / OWNER).read_text())["run_id"] == "r2"  # resumed: now r2's
    assert not same.discarded and same.run("parse", lambda: None).uri == str(staging / "parse")
    assert same.resumed == ["parse"]
    with pytest.raises(AttributeError):  # `None` is no dataset: the half-written stage is run again
        same.run("graphs", lambda: None)
    assert same.resumed == ["parse"]

    other = Stages(Store().at(str(staging)), fingerprint="bbb")
    assert other.discarded and not (staging / "parse").exists()
    assert json.loads((staging / OWNER).read_text())["fingerprint"] == "bbb"


def test_staging_discarded_by_a_run_killed_midway_still_belongs_to_a_batch_job(tmp_path, monkeypatch, caplog):
    """Discarding deletes the stages before the owner file: a run killed in between leaves staging that the
    next run recognizes and clears (it once blocked every later run until deleted by hand). Each stage logs
    its start and end with its rows."""
    from xh.storage.store import Location

    staging = tmp_path / "staging"
    Stages(Store().at(str(staging)), fingerprint="aaa", run_id="r1")
    _finish(staging, "parse")
    (staging / "inputs.json").write_text("{}")
    deleted, fs_path = [], Location.fs_path

    class Killed:  # the filesystem of a run killed at its first file deletion
        def __init__(self, fs):
            self.fs = fs

        def __getattr__(self, name):
            return getattr(self.fs, name)

        def delete_file(self, path):
            deleted.append(path)
            raise KeyboardInterrupt("killed")

    with monkeypatch.context() as patch:
        patch.setattr(Location, "fs_path", lambda self: (Killed(fs_path(self)[0]), fs_path(self)[1]))
        with pytest.raises(KeyboardInterrupt):
            Stages(Store().at(str(staging)), fingerprint="bbb", run_id="r2")
    assert not deleted[0].endswith(OWNER) and (staging / OWNER).exists()
    Stages(Store().at(str(staging)), fingerprint="bbb", run_id="r3")
    assert sorted(p.name for p in staging.iterdir()) == [OWNER]

    import logging

    class Rows:  # what `write_stage` calls on a Ray Dataset
        def write_parquet(self, path, **kwargs):
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"qid": ["a", "b"], "reason": [None, None]}), f"{path}/part-0.parquet")

    with caplog.at_level(logging.INFO, logger="xh.stages"):
        Stages(Store().at(str(staging)), fingerprint="bbb", run_id="r3").run("parse", Rows)
    lines = [r.getMessage() for r in caplog.records if r.name == "xh.stages"]
    assert lines[0] == "stage parse: start" and lines[1].startswith("stage parse: end, 2 rows, ")


def test_a_folder_without_a_fingerprint_is_never_resumed_nor_deleted(tmp_path):
    staging = tmp_path / "staging"
    _finish(staging, "parse")  # files with no owner file: not staging this project wrote
    with pytest.raises(ForeignFolderError) as error:
        Stages(Store().at(str(staging)), fingerprint="aaa")
    assert "\n" not in str(error.value) and OWNER in str(error.value)
    assert isinstance(error.value, USER_ERRORS)  # one line, exit 2
    assert (staging / "parse" / MARKER).exists()
    # nor one whose owner file is a table's staging (another kind): not a batch job's to delete
    (staging / OWNER).write_text(json.dumps({"kind": GRAPHS, "target": str(tmp_path / "graphs")}))
    with pytest.raises(ForeignFolderError):
        Stages(Store().at(str(staging)), fingerprint="aaa")
    assert (staging / "parse" / MARKER).exists()
    # an empty folder (a run killed before it wrote its fingerprint) is taken
    (staging / OWNER).unlink()
    (staging / "parse" / MARKER).unlink()
    (staging / "parse").rmdir()
    Stages(Store().at(str(staging)), fingerprint="aaa")
    assert json.loads((staging / OWNER).read_text())["fingerprint"] == "aaa"


def test_the_fingerprint_changes_with_an_input_file_and_with_the_settings(tmp_path):
    question_file = tmp_path / "q.jsonl"
    question_file.write_text('{"qid": "1", "question": "who?"}\n')
    files = [Store().at(str(question_file))]
    base = fingerprint({"batch_graphs": 8}, files)
    assert fingerprint({"batch_graphs": 8}, files) == base
    assert fingerprint({"batch_graphs": 4}, files) != base
    assert fingerprint({"batch_graphs": 8}, files, {str(question_file): "sha256:x"}) != base
    question_file.write_text('{"qid": "1", "question": "who was it?"}\n')
    assert fingerprint({"batch_graphs": 8}, files) != base
    assert len(base) == 16 and fingerprint({"batch_graphs": 8}) != base  # the files' content counts

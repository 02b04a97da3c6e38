"""The BM25 index is built aside and swapped in whole: a rebuild killed midway leaves the previous index
loading and answering as before (it used to be rebuilt in place: old manifest, new shard files)."""

from __future__ import annotations

import bz2
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from xh.retrieval.bm25 import CorpusStats, search_shards
from xh.retrieval.index import build_shard, doc_ranges, load_index, range_stats, staged_index, write_manifest
from xh.stages import wiki
from xh.storage.store import Store, located
from xh.storage.tables import require_complete

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ["river town 17", "mountain castle 3", "forest bridge 250", "harbour tower 1999"]
WORDS = "river town mountain castle forest bridge harbour tower valley lake market abbey".split()


def _tables(root: Path, docs: int, seed: int) -> None:
    """Wiki tables of `docs` generated pages at <root>/tables (replacing those there)."""
    lines = []
    for i in range(docs):
        title = f"{WORDS[(i * seed) % len(WORDS)].title()} {WORDS[(i + seed) % len(WORDS)]} {i}"
        text = " ".join(WORDS[(i * k + seed) % len(WORDS)] for k in range(40)) + f" number {i}."
        lines.append(json.dumps({"id": str(i), "title": title, "text": [text], "text_with_links": [text]}))
    dump = root / f"dump-{seed}"
    dump.mkdir(parents=True, exist_ok=True)
    (dump / "wiki_00.bz2").write_bytes(bz2.compress("\n".join(lines).encode()))
    wiki.write_tables(
        Store().at(str(root / "tables")), [Store().at(str(dump / "wiki_00.bz2"))], "hotpot", partitions=2, local=True
    )


def _index_in_process(root: Path) -> None:
    """The index of <root>/tables at <root>/index/bm25, built the way the driver does, without Ray."""
    ranges = doc_ranges(str(root / "tables" / "docs"), 4)
    stats = CorpusStats.merge(range_stats(r, True) for r in ranges)
    with staged_index(str(root / "index" / "bm25")) as stage:
        entries = [build_shard(r, stats, stage.uri, True) for r in ranges]
        write_manifest(stage.uri, stats, entries, str(root / "tables"), True)
        stage.rows = stats.num_docs


def _answers(index: Path) -> list[tuple[list[str], list[float]]]:
    return [(r.doc_ids, r.scores.round(9).tolist()) for r in search_shards(load_index(str(index)), QUERIES, k=10)]


def _files(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _driver(root: Path, ray_tmp: str) -> subprocess.Popen:
    args = ["index", "--set", f"storage.root={root}", "--set", "ray.num_cpus=1"]
    return subprocess.Popen(
        [sys.executable, "-m", "workflows.cli", "retrieve", *args],
        cwd=ROOT,
        env={**os.environ, "RAY_TMPDIR": ray_tmp},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its Ray processes share its session: the test stops exactly those
    )


def _stop_session(sid: int) -> None:
    """Kill what is left of a killed driver's local cluster (processes of its session, by pid)."""
    for pid in (int(name) for name in os.listdir("/proc") if name.isdigit()):
        try:
            if os.getsid(pid) == sid:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _new_shard_file(index: Path, staging: Path, since: float) -> bool:
    for folder in (staging / "shards", index / "shards"):
        if folder.is_dir():
            for path in folder.rglob("*"):
                try:
                    if path.is_file() and (folder == staging / "shards" or path.stat().st_mtime > since):
                        return True
                except FileNotFoundError:
                    pass
    return False


@pytest.fixture
def ray_tmp():
    folder = tempfile.mkdtemp(prefix="xhray", dir="/tmp")  # short: Ray's socket paths have a length limit
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(900)  # the 400 s deadline for the first shard and the re-run's 300 s
def test_an_index_rebuild_killed_midway_leaves_the_previous_index_whole(tmp_path, ray_tmp):
    root = tmp_path / "world"
    index, staging = root / "index" / "bm25", root / "index" / ".bm25.staging"
    _tables(root, 300, seed=1)
    _index_in_process(root)
    before, files = _answers(index), _files(index)
    assert any(ids for ids, _ in before)

    _tables(root, 3000, seed=5)  # a new corpus: other stats, other doc ranges
    since = time.time()
    driver = _driver(root, ray_tmp)
    try:
        deadline = time.monotonic() + 400  # wide: a loaded machine or a second test process slows the start
        while not _new_shard_file(index, staging, since):
            assert driver.poll() is None, f"the build ended before it was killed:\n{driver.communicate()[1]}"
            assert time.monotonic() < deadline, "no shard was written within 400 s"
            time.sleep(0.002)
        os.kill(driver.pid, signal.SIGKILL)  # mid-build: the first new shard file exists
        driver.wait(timeout=30)
    finally:
        time.sleep(1)
        _stop_session(driver.pid)
        driver.communicate()

    assert _files(index) == files, "the killed rebuild changed the previous index"
    assert _answers(index) == before
    assert staging.exists()  # the kill came mid-build, before the swap

    # the next run clears the killed run's staging (it carries its proof) and swaps the new index in
    rerun = _driver(root, ray_tmp)
    try:
        out, err = rerun.communicate(timeout=300)
    finally:
        _stop_session(rerun.pid)
    assert rerun.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["docs"] == 3000
    assert require_complete(located(index))["rows"] == 3000 and not staging.exists()
    assert _answers(index) != before

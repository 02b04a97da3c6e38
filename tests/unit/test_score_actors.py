"""The blocks a scoring stage's actors are fed (`xh.stages.score_actors`): planned from the finished stage's
files without reading their rows into the driver, every usable row once, in order, in equal blocks; an
actor's block read back from those files. No Ray needed: the planning and an actor's loop are plain code."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from xh.stages.score_actors import PARSED, _Worker, plan_blocks
from xh.storage.store import Store


def _stage(folder, files: list[int], quarantined_every: int = 0) -> list[str]:
    """Parse-stage files of `files[i]` rows each (every `quarantined_every`-th row quarantined); returns
    the usable qids in file-name order."""
    folder.mkdir()
    usable, n = [], 0
    for i, rows in enumerate(files):
        table = []
        for _ in range(rows):
            bad = quarantined_every and n % quarantined_every == 0
            table.append({"qid": f"q{n}", "question": "?", "type": None, "reason": "bad" if bad else None})
            usable += [] if bad else [f"q{n}"]
            n += 1
        pq.write_table(pa.Table.from_pylist(table, schema=PARSED), folder / f"part-{i:05d}.parquet")
    return usable


class _Echo(_Worker):
    def rows(self, batch: pa.Table) -> pa.Table:
        return batch


def test_a_stage_is_cut_into_equal_blocks_of_its_usable_rows_each_read_once_in_order(tmp_path):
    usable = _stage(tmp_path / "parsed", [7, 0, 30, 13], quarantined_every=5)
    folder = Store().at(str(tmp_path / "parsed"))
    blocks = plan_blocks(folder, batch_size=8, actors=2)
    assert len(blocks) == 6  # 40 usable rows: 5 blocks of at most 8, rounded up to a multiple of 2 actors
    fs, _ = folder.fs_path()
    read = []
    for i, pieces in enumerate(blocks):
        target = str(tmp_path / f"out-{i}.parquet")
        written = _Echo().run(pieces, fs, target, fs)
        rows = pq.read_table(target)["qid"].to_pylist()
        assert written == len(rows) in (6, 7)  # equal blocks: 40 rows in 6
        read += rows
    assert read == usable
    assert any(len(pieces) == 2 for pieces in blocks)  # a block that spans two files


def test_a_stage_without_usable_rows_has_no_blocks(tmp_path):
    _stage(tmp_path / "parsed", [3], quarantined_every=1)
    assert plan_blocks(Store().at(str(tmp_path / "parsed")), batch_size=8, actors=2) == []

"""Staged tables on S3 (moto): no rename there, so the staged objects are copied in and the marker last."""

import pytest

from tests.conftest import TEST_BUCKET
from xh.storage.store import Store
from xh.storage.tables import GRAPHS, ForeignFolderError, IncompleteTableError, read_marker, require_complete, staged
from xh.storage.uris import list_files, open_input, open_output


def _put(uri: str, text: str) -> None:
    with open_output(uri) as f:
        f.write(text.encode())


def _read(uri: str) -> str:
    with open_input(uri) as f:
        return f.read().decode()


def test_an_s3_table_is_replaced_whole_and_a_failed_run_leaves_the_previous_one(s3_endpoint):
    store = Store(s3=s3_endpoint)
    target = f"s3://{TEST_BUCKET}/tables-s3/graphs"
    table = store.at(target)
    with staged(table, kind=GRAPHS) as stage:
        _put(f"{stage.uri}/part-00000.parquet", "old-0")
        _put(f"{stage.uri}/part-00001.parquet", "old-1")
        stage.rows = 2
    assert require_complete(table)["rows"] == 2

    with pytest.raises(RuntimeError, match="killed"), staged(table, kind=GRAPHS) as stage:
        _put(f"{stage.uri}/part-00000.parquet", "new-0")
        raise RuntimeError("killed midway")
    assert _read(f"{target}/part-00000.parquet") == "old-0" and read_marker(table)["rows"] == 2

    with staged(table, kind=GRAPHS) as stage:
        _put(f"{stage.uri}/part-00000.parquet", "new-0")
        stage.rows = 1
    names = [u.rsplit("/", 1)[1] for u in list_files(target, s3_endpoint)]
    assert names == ["_complete.json", "part-00000.parquet"]  # the old second shard is gone
    assert _read(f"{target}/part-00000.parquet") == "new-0" and read_marker(table)["rows"] == 1
    assert list_files(f"s3://{TEST_BUCKET}/tables-s3", s3_endpoint) == [f"{target}/{n}" for n in names]

    user = f"s3://{TEST_BUCKET}/tables-s3/mine"
    _put(f"{user}/notes.txt", "mine")
    with pytest.raises(IncompleteTableError, match="incomplete"):
        require_complete(store.at(user))
    with pytest.raises(ForeignFolderError, match="refusing"), staged(store.at(user), kind=GRAPHS):
        pytest.fail("started writing over a user's folder")
    assert _read(f"{user}/notes.txt") == "mine"

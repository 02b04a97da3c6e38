import pyarrow.fs as pafs
import pytest

from xh.storage.uris import S3Settings, join, list_files, open_input, open_output, resolve

ENV = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_REGION": "eu-west-1",
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
}


def test_settings_from_env_feed_every_consumer():
    s3 = S3Settings.from_env(ENV)
    assert s3.endpoint_url == "http://127.0.0.1:9000" and s3.region == "eu-west-1"
    assert s3.env()["MLFLOW_S3_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert s3.ray_runtime_env()["env_vars"]["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert isinstance(s3.pyarrow_fs(), pafs.S3FileSystem)


def test_config_endpoint_wins_over_env():
    s3 = S3Settings.from_env(ENV, endpoint_url="http://other:1", region="us-west-2")
    assert (s3.endpoint_url, s3.region) == ("http://other:1", "us-west-2")


def test_credentials_never_printed():
    s3 = S3Settings.from_env(ENV)
    assert "s3cr3t" not in repr(s3) and "AKIDEXAMPLE" not in repr(s3)
    assert "s3cr3t" not in str(s3.describe()) and s3.describe()["credentials"] is True


def test_ray_workers_get_the_endpoint_and_credential_file_paths_but_never_keys(monkeypatch):
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/etc/xh/aws/credentials")
    env_vars = S3Settings.from_env({**ENV, "AWS_SESSION_TOKEN": "tok-value"}).ray_runtime_env()["env_vars"]
    assert env_vars["AWS_REGION"] == "eu-west-1" and env_vars["XH_S3_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert env_vars["AWS_SHARED_CREDENTIALS_FILE"] == "/etc/xh/aws/credentials"
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(env_vars)
    assert "s3cr3t" not in str(env_vars) and "tok-value" not in str(env_vars)


def test_resolve_local_and_s3(tmp_path):
    fs, path = resolve(str(tmp_path / "x"))
    assert isinstance(fs, pafs.LocalFileSystem) and path == str(tmp_path / "x")
    assert resolve(f"file://{tmp_path}")[1] == str(tmp_path)
    fs, path = resolve("s3://bucket/pre/fix/", S3Settings.from_env(ENV))
    assert isinstance(fs, pafs.S3FileSystem) and path == "bucket/pre/fix"
    assert join("s3://b/p/", "x", "y") == "s3://b/p/x/y"
    with pytest.raises(ValueError, match="unsupported storage URI"):
        resolve("gs://bucket/x")


def test_local_round_trip_and_listing(tmp_path):
    with open_output(str(tmp_path / "a" / "b" / "f.txt")) as f:
        f.write(b"hello")
    with open_input(str(tmp_path / "a" / "b" / "f.txt")) as f:
        assert f.read() == b"hello"
    assert list_files(str(tmp_path), suffix=".txt") == [str(tmp_path / "a" / "b" / "f.txt")]
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        list_files(str(tmp_path / "missing"))


def test_streams_keep_bytes_as_they_are(tmp_path):
    """No compression by file extension: a .bz2 holds exactly the bytes written."""
    import bz2

    payload = bz2.compress(b"line\n")
    with open_output(str(tmp_path / "x.bz2")) as f:
        f.write(payload)
    assert (tmp_path / "x.bz2").read_bytes() == payload
    with open_input(str(tmp_path / "x.bz2")) as f:
        assert f.read() == payload


def test_a_store_made_from_config_reaches_its_locations_and_pickles_without_printing_keys(tmp_path):
    import pickle

    from xh.config import load_config
    from xh.storage.store import Store
    from xh.storage.tables import GRAPHS, IncompleteTableError

    cfg = load_config(overrides=[f"storage.root={tmp_path}", "storage.s3_endpoint_url=http://127.0.0.1:9"])
    store = Store.from_config(cfg)
    assert store.s3.endpoint_url == "http://127.0.0.1:9" and store.root == str(tmp_path)
    table = store.under_root("graphs", "hotpot")
    assert table.uri == join(str(tmp_path), "graphs", "hotpot") and str(table) == table.uri
    with pytest.raises(IncompleteTableError, match="no graphs at"):
        table.require_complete("graphs")
    with table.staged(kind=GRAPHS, stage="graphs") as stage:
        store.at(stage.uri, "part-0.bin").write_bytes(b"rows")
        stage.rows = 1
    assert table.require_complete("graphs")["rows"] == 1 and table.marker()["kind"] == GRAPHS
    assert table.join("part-0.bin").read_bytes() == b"rows" and table.files(".bin") == [table.uri + "/part-0.bin"]
    assert not store.at(tmp_path, "nothing").exists()
    secret = Store(root="s3://b/p", s3=S3Settings.from_env(ENV))
    assert "s3cr3t" not in repr(secret.at("s3://b/p/x"))
    assert pickle.loads(pickle.dumps(secret.at("s3://b/p/x"))) == secret.at("s3://b/p/x")

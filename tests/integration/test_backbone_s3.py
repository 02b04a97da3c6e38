"""A backbone folder on S3: copied once per node into the cache, then loaded by `from_pretrained`."""

from pathlib import Path

import pytest

from tests.conftest import TEST_BUCKET
from xh.model.backbones import resolve_backbone
from xh.storage.store import Store

pytestmark = pytest.mark.integration


def test_an_s3_backbone_is_downloaded_once_and_loads(s3_endpoint, minilm_path, tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoTokenizer

    monkeypatch.setenv("XH_CACHE_DIR", str(tmp_path / "cache"))
    fs = s3_endpoint.pyarrow_fs()
    files = [p for p in Path(minilm_path).iterdir() if p.is_file() and p.suffix in (".json", ".txt")]
    for local in files:  # config and tokenizer only: the weights add nothing to what is tested
        with fs.open_output_stream(f"{TEST_BUCKET}/models/minilm/{local.name}") as out:
            out.write(local.read_bytes())

    store = Store(s3=s3_endpoint)
    folder = resolve_backbone(f"s3://{TEST_BUCKET}/models/minilm/", store)
    assert Path(folder).is_relative_to(tmp_path / "cache") and (Path(folder) / ".complete").exists()
    assert {p.name for p in files} <= {p.name for p in Path(folder).iterdir()}
    assert AutoConfig.from_pretrained(folder).hidden_size == AutoConfig.from_pretrained(minilm_path).hidden_size
    assert AutoTokenizer.from_pretrained(folder)("hop attention")["input_ids"][0] == 101

    stamp = (Path(folder) / "config.json").stat().st_mtime_ns
    assert resolve_backbone(f"s3://{TEST_BUCKET}/models/minilm", store) == folder  # same folder, no copy
    assert (Path(folder) / "config.json").stat().st_mtime_ns == stamp

    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_backbone(f"s3://{TEST_BUCKET}/models/none", store)

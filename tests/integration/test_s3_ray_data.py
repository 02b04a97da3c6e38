"""Ray Data against the S3 endpoint: the generated dump is read from S3 and Parquet written back."""

import json

import pyarrow.dataset as pads

from tests.conftest import TEST_BUCKET
from workflows import synth as synth_workflow
from xh import synth
from xh.config import load_config


def test_generated_dump_read_from_s3_and_parquet_written_back(ray_cluster, s3_endpoint):
    import ray.data

    root = f"s3://{TEST_BUCKET}/harness"
    cfg = load_config(
        None,
        [
            f"storage.root={root}",
            "synth.num_docs=300",
            "synth.docs_per_shard=100",
            "synth.num_questions=20",
            "synth.num_claims=20",
        ],
    )
    written = synth_workflow.run(cfg)  # shards written by Ray tasks on both nodes, straight to S3
    assert written["shards"] == 3 and written["docs"] == 300

    fs = s3_endpoint.pyarrow_fs()
    shards = [f"{TEST_BUCKET}/harness/world/{p}" for p in (synth.wiki_shard_path(k) for k in range(3))]

    def pages_of(shard: dict) -> list[dict]:
        lines = shard["bytes"].splitlines()  # Ray Data decompressed the .bz2 (detected by its extension)
        return [{k: v for k, v in json.loads(line).items() if k in ("id", "title", "text")} for line in lines]

    pages = ray.data.read_binary_files(shards, filesystem=fs).flat_map(pages_of)
    pages.write_parquet(f"{TEST_BUCKET}/harness/pages", filesystem=fs)

    back = pads.dataset(f"{TEST_BUCKET}/harness/pages", filesystem=fs, format="parquet").to_table()
    spec = synth.WorldSpec(num_docs=300, seed=cfg.synth.seed)
    assert sorted(back["title"].to_pylist()) == sorted(synth.title(spec, i) for i in range(300))
    first = back.filter(pads.field("title") == synth.title(spec, 0)).to_pylist()[0]
    assert first["text"] == list(synth.page(spec, 0).sentences)

    with fs.open_input_stream(f"{TEST_BUCKET}/harness/world/truth/summary.json") as f:
        assert json.loads(f.read())["num_links"] == written["links"]

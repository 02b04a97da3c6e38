"""The BM25 index on storage: one manifest (analyzer, corpus statistics, shards and their doc ranges)
and one folder per shard (`xh.retrieval.bm25`)."""

from __future__ import annotations

import json

from xh.storage import S3Settings, join, open_input

INDEX_MANIFEST = "manifest.json"


def corpus_snapshot(index_uri: str, s3: S3Settings | None) -> str:
    """The index manifest's analyzer fingerprint and corpus size: what every prediction was retrieved from."""
    with open_input(join(index_uri, INDEX_MANIFEST), s3) as f:
        manifest = json.loads(f.read())
    stats = manifest.get("stats", {})
    return f"{index_uri} docs={stats.get('num_docs', '?')} analyzer={manifest['analyzer']['fingerprint']}"

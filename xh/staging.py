"""A batch job's stages, each written whole under a staging folder before the next starts, so that a
failed run re-run resumes after its last finished stage; then its outputs move into place.

    stages = Stages(staging_uri, s3)          # fail_before="graphs": stop there (tests of resumption)
    parsed = stages.run("parse", lambda: files.map_batches(parse))   # a Ray Dataset -> <staging>/parse/*.parquet
    graphs = stages.run("graphs", lambda: read_stage(parsed, s3).map_batches(build))
    stages.resumed, stages.seconds                 # the stages a re-run skipped; seconds per stage
    write_quarantine([parsed, graphs], quarantine_uri, s3)   # {reason: count}
    # the predictions' partition: `xh.partitions` (a run adds its rows)
    count_rows(partition_uri, s3)
    usable_rows(parsed, s3)                       # the rows the next stage reads (0: skip its actor pool)

A stage is finished when its folder holds `_SUCCESS`, written after the last Parquet file. A stage's
rows that could not be used carry the QUARANTINE columns (`with_quarantine`), `reason` not null; the
next stage reads only the others (`read_stage`), and `write_quarantine` gathers them at the end.
A stage's dataset comes from the caller; only `read_stage` imports Ray (when called).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence

import pyarrow as pa

from xh import schemas
from xh.storage import S3Settings, is_s3, join, list_files, list_paths, resolve
from xh.tables import ForeignFolderError

DONE = "_SUCCESS"
FINGERPRINT = "_FINGERPRINT"


def with_quarantine(fields: Sequence[pa.Field]) -> pa.Schema:
    """A stage's schema: its own columns, then the QUARANTINE columns (null on rows it could use)."""
    return pa.schema([*fields, *(f.with_nullable(True) for f in schemas.QUARANTINE)])


def empty_folder(uri: str, s3: S3Settings | None) -> tuple:
    """(filesystem, path) of a folder that exists and is empty, whatever an earlier run left in it."""
    fs, path = resolve(uri, s3)
    fs.create_dir(path, recursive=True)
    fs.delete_dir_contents(path)
    return fs, path


def done(uri: str, s3: S3Settings | None) -> bool:
    fs, path = resolve(join(uri, DONE), s3)
    return fs.get_file_info(path).type.name != "NotFound"


def write_stage(dataset, uri: str, s3: S3Settings | None, schema: pa.Schema | None = None) -> None:
    """Write a Ray Dataset as a stage's Parquet files and mark it finished (a half-written stage is cleared first);
    with `schema`, an empty result is one empty Parquet file of that schema."""
    import pyarrow.parquet as pq

    fs, path = empty_folder(uri, s3)
    dataset.write_parquet(path, filesystem=fs, ray_remote_args={"num_cpus": 0.25})
    if schema is not None and not list_files(uri, s3, suffix=".parquet"):
        pq.write_table(schema.empty_table(), f"{path}/part-empty.parquet", filesystem=fs)
    with fs.open_output_stream(f"{path}/{DONE}", compression=None) as out:
        out.write(b"")


def read_stage(uri: str, s3: S3Settings | None):
    """A finished stage's usable rows (no reason) as a materialized Ray Dataset."""
    import ray.data
    from ray.data.expressions import col

    fs, path = resolve(uri, s3)
    rows = ray.data.read_parquet(path, filesystem=fs, num_cpus=0.25)
    # Read before an actor pool takes the CPUs: Ray's file listing wants a whole one.
    return rows.filter(expr=col("reason").is_null(), num_cpus=0.25).materialize()


class InjectedFailure(RuntimeError):
    """Raised before the stage named by `fail_before` (tests of resumption)."""


def fingerprint(
    inputs: Sequence[str], settings: dict, s3: S3Settings | None, digests: dict[str, str] | None = None
) -> str:
    """A digest of what a run reads and how: each input file's path and content (`content_digest`, or
    `digests[uri]` where the caller has it already), and `settings` (JSON-able); staging written under
    another fingerprint is never resumed."""
    digests = digests or {}
    files = [[uri, digests.get(uri) or content_digest(uri, s3)] for uri in inputs]
    text = json.dumps({"inputs": files, "settings": settings}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def content_digest(uri: str, s3: S3Settings | None) -> str:
    """What a file holds: the SHA-256 of a local file's bytes, or an S3 object's ETag (the store's
    digest of the bytes, read without downloading them). Size and modification time are not enough:
    a file replaced by one of the same size, its time set back, would resume the old file's stages."""
    if is_s3(uri):
        return "etag:" + _etag(uri, s3)
    fs, path = resolve(uri, s3)
    digest = hashlib.sha256()
    with fs.open_input_stream(path, compression=None) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _etag(uri: str, s3: S3Settings | None) -> str:
    import boto3

    settings = s3 or S3Settings.from_env()
    settings.require_endpoint(uri)
    client = boto3.client(
        "s3",
        endpoint_url=settings.endpoint_url,
        region_name=settings.region,
        aws_access_key_id=settings.access_key_id,
        aws_secret_access_key=settings.secret_access_key,
        aws_session_token=settings.session_token,
    )
    bucket, _, key = uri[len("s3://") :].partition("/")
    return client.head_object(Bucket=bucket, Key=key)["ETag"]


class Stages:
    """The stages of one run under `staging`: each runs unless a finished copy is there already.

    With a `fingerprint` (see `fingerprint`), staging left by a run of other inputs or settings is cleared
    first, and the fingerprint is written there (`_FINGERPRINT`); a non-empty folder without one is refused
    (`ForeignFolderError`), never cleared."""

    def __init__(
        self,
        staging: str,
        s3: S3Settings | None,
        fail_before: str | None = None,
        fingerprint: str | None = None,
    ) -> None:
        self.staging, self.s3, self.fail_before = staging, s3, fail_before
        self.resumed: list[str] = []
        self.seconds: dict[str, float] = {}
        self.discarded = False  # whether staging of another fingerprint was cleared
        if fingerprint is not None:
            self._claim(fingerprint)

    def _claim(self, digest: str) -> None:
        fs, path = resolve(self.staging, self.s3)
        marker = f"{path}/{FINGERPRINT}"
        if fs.get_file_info(path).type.name != "NotFound":
            found = None
            if fs.get_file_info(marker).type.name != "NotFound":
                with fs.open_input_stream(marker) as f:
                    found = f.read().decode()
            if found == digest:
                return
            if found is None and list_paths(fs, path):
                # the fingerprint is the first file of this project's staging: without it, not ours to delete
                raise ForeignFolderError(
                    f"{self.staging} holds files but no {FINGERPRINT}: not staging of this project, refusing to "
                    "delete them; move them away"
                )
            self.discarded = True
        empty_folder(self.staging, self.s3)
        with fs.open_output_stream(marker, compression=None) as out:
            out.write(digest.encode())

    def run(
        self, name: str, dataset: Callable[[], object], resume: bool = True, schema: pa.Schema | None = None
    ) -> str:
        """Write `dataset()` to `<staging>/<name>` (or keep a finished one when `resume`); returns its URI.

        With `schema`, a stage that wrote no rows gets one empty Parquet file of that schema, so the
        next stage (and the partition) reads an empty table rather than a folder with no files."""
        if name == self.fail_before:
            raise InjectedFailure(f"fail_before={name}: stopping before the {name} stage")
        uri = join(self.staging, name)
        start = time.perf_counter()
        if resume and done(uri, self.s3):
            self.resumed.append(name)
        else:
            write_stage(dataset(), uri, self.s3, schema)
        self.seconds[name] = time.perf_counter() - start
        return uri

    def clear(self) -> None:
        fs, path = resolve(self.staging, self.s3)
        fs.delete_dir(path)


def count_rows(uri: str, s3: S3Settings | None) -> int:
    import pyarrow.dataset as pads

    fs, path = resolve(uri, s3)
    return pads.dataset(path, filesystem=fs, format="parquet", exclude_invalid_files=True).count_rows()


def usable_rows(uri: str, s3: S3Settings | None) -> int:
    """How many of a finished stage's rows the next stage reads (those without a reason)."""
    import pyarrow.dataset as pads

    fs, path = resolve(uri, s3)
    dataset = pads.dataset(path, filesystem=fs, format="parquet", exclude_invalid_files=True)
    return dataset.count_rows(filter=pads.field("reason").is_null())


def write_quarantine(stages: Sequence[str], target: str, s3: S3Settings | None) -> dict[str, int]:
    """The stages' rows with a reason, as one QUARANTINE file in `target` (replaced); returns {reason: count}."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    fs, dst = empty_folder(target, s3)
    parts = []
    for uri in stages:
        _, path = resolve(uri, s3)
        rows = pads.dataset(path, filesystem=fs, format="parquet", exclude_invalid_files=True).to_table(
            columns=schemas.QUARANTINE.names, filter=pads.field("reason").is_valid()
        )
        parts.append(rows.cast(schemas.QUARANTINE))
    table = pa.concat_tables(parts)
    pq.write_table(table, f"{dst}/part-00000.parquet", filesystem=fs)
    counts: dict[str, int] = {}
    for reason in table["reason"].to_pylist():
        counts[reason] = counts.get(reason, 0) + 1
    return counts

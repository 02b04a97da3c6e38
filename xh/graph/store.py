"""The `graphs` table on storage: shards written by graph builders, read back without the corpus.

    write_shard(graph_rows, store.at("runs/demo/graphs/hotpot"), shard=3)  # -> part-00003.parquet
    for row in iter_graphs("runs/demo/graphs/hotpot"):                     # GRAPHS rows as dicts
        encoded = encode_graph(row, tokenizer, 512)
    read_graphs("runs/demo/graphs/hotpot").iter_rows()                     # the same as a Ray dataset
    rows = read_eval_set("runs/demo/graphs/hotpot-dev")                    # a small folder, all in memory
    summary = read_summary("runs/demo/graphs/hotpot")                      # _summary.json (settings, counts)
    missed = quarantined_qids("runs/demo/graphs/hotpot")                   # ids of questions that got no graph

A graphs folder holds only `part-*.parquet` files of `xh.schemas.GRAPHS` (plus `_summary.json`, which
Parquet readers skip), so `ray.data.read_parquet(folder)` reads it as is; quarantined questions live in
a folder of their own (`QUARANTINE` schema), never beside the graphs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from xh import schemas
from xh.jsonfiles import InputFileError
from xh.storage import S3Settings, join, resolve
from xh.store import Location


def shard_name(shard: int) -> str:
    return f"part-{shard:05d}.parquet"


def write_shard(rows: list[dict], folder: Location, shard: int, schema: pa.Schema = schemas.GRAPHS) -> str:
    """Write rows (cast to `schema`) as one Parquet file of `folder`; returns its URI."""
    file = folder.join(shard_name(shard))
    fs, path = file.fs_path()
    fs.create_dir(folder.fs_path()[1], recursive=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, filesystem=fs)
    return file.uri


def clear_folder(folder: Location) -> None:
    """Create `folder`, or empty it: a rebuild never mixes shards of two runs."""
    fs, path = folder.fs_path()
    fs.create_dir(path, recursive=True)
    fs.delete_dir_contents(path)


def _existing(folder: str, s3: S3Settings | None, what: str):
    """(filesystem, path) of a complete graphs folder (one with `_complete.json`, see `xh.tables`) whose
    files hold every GRAPHS column; a one-line error otherwise (`FileNotFoundError` for a build that
    failed or was interrupted, `InputFileError` for a missing column), before any worker reads it."""
    from xh.tables import require_complete

    require_complete(folder, s3, what, hint=" (run `xh graphs build` first)")
    fs, path = resolve(folder, s3)
    needed = schemas.GRAPHS.names
    for fragment in pads.dataset(path, filesystem=fs, format="parquet").get_fragments():
        missing = [name for name in needed if name not in fragment.physical_schema.names]
        if missing:
            raise InputFileError(
                f"{what} at {folder}: {fragment.path} lacks column(s) {', '.join(missing)} of the graphs table "
                "(rebuild it with `xh graphs build`)"
            )
    return fs, path


def require_graphs(folder: str, s3: S3Settings | None = None, what: str = "graphs") -> None:
    """The checks every reader of a graphs folder makes (see `_existing`), for drivers that hand the
    folder to Ray readers of their own (training)."""
    _existing(folder, s3, what)


def _graphs_folder(folder: str, s3: S3Settings | None):
    return _existing(folder, s3, "graphs")


def iter_graphs(folder: str, s3: S3Settings | None = None, batch_rows: int = 256) -> Iterator[dict]:
    """GRAPHS rows of a folder as dicts, one Parquet batch in memory at a time, in file order."""
    fs, path = _graphs_folder(folder, s3)
    dataset = pads.dataset(path, filesystem=fs, format="parquet", schema=schemas.GRAPHS)
    for batch in dataset.to_batches(batch_size=batch_rows):
        yield from batch.to_pylist()


def read_graphs(folder: str, s3: S3Settings | None = None, num_cpus: float = 0.25):
    """A graphs folder as a Ray dataset of GRAPHS rows (for the trainer; `iter_graphs` reads it without Ray).

    Read tasks ask for a fraction of a CPU, so that they still run beside actors or trainers holding the rest.
    """
    import ray.data

    fs, path = _graphs_folder(folder, s3)
    return ray.data.read_parquet(path, filesystem=fs, file_extensions=["parquet"], num_cpus=num_cpus)


def read_eval_set(folder: str, s3: S3Settings | None = None) -> list[dict]:
    """Every row of a graphs folder with gold labels, in memory: what `xh promote` scores the models on."""
    fs, path = _existing(folder, s3, "evaluation set")
    return pads.dataset(path, filesystem=fs, format="parquet").to_table().to_pylist()


def read_summary(folder: str, s3: S3Settings | None = None) -> dict:
    """The folder's `_summary.json` (graph settings and counts), or {} when it has none."""
    from xh.storage import open_input

    try:
        with open_input(join(folder, "_summary.json"), s3) as f:
            return json.loads(f.read())
    except (FileNotFoundError, OSError):
        return {}


_QID = re.compile(r'"(?:qid|_id|id)":\s*"((?:[^"\\]|\\.)*)"')
_TYPE = re.compile(r'"type":\s*"(\w+)"')


def qids_of_quarantine(rows: Iterable[dict], kinds: Iterable[str] | None = None) -> list[str]:
    """The question ids of QUARANTINE rows (read from their `raw` record, truncated or not), each once;
    a row whose record shows no id gives none. `kinds`: keep only questions of those types (or of none)."""
    qids = []
    for row in rows:
        raw = row.get("raw") or ""
        found, kind = _QID.search(raw), _TYPE.search(raw)
        if found and (kinds is None or kind is None or kind.group(1) in kinds):
            qids.append(json.loads(f'"{found.group(1)}"'))
    return list(dict.fromkeys(qids))


def quarantined_qids(folder: str, s3: S3Settings | None = None, kinds: Iterable[str] | None = None) -> list[str]:
    """Ids of the questions that the build of a graphs folder quarantined (its summary names the
    quarantine folder); [] when there is none. Evaluation counts them as misses."""
    quarantine = read_summary(folder, s3).get("quarantine")
    if not quarantine:
        return []
    fs, path = resolve(quarantine, s3)
    if fs.get_file_info(path).type.name == "NotFound":
        return []
    table = pads.dataset(path, filesystem=fs, format="parquet", schema=schemas.QUARANTINE).to_table(columns=["raw"])
    return qids_of_quarantine(table.to_pylist(), kinds)

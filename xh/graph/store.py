"""The `graphs` table on storage: shards written by graph builders, read back without the corpus.

    folder = store.at("runs/demo/graphs/hotpot")                          # a Location (xh.storage.store)
    write_shard(graph_rows, folder, shard=3)                               # -> part-00003.parquet
    for row in iter_graphs(folder):                                        # GRAPHS rows as dicts
        encoded = encode_graph(row, tokenizer, 512)
    read_graphs(folder).iter_rows()                                        # the same as a Ray dataset
    rows = read_eval_set(store.at("runs/demo/graphs/hotpot-dev"))          # a small folder, all in memory
    summary = read_summary(folder)                                         # _summary.json (settings, counts)
    missed = quarantined_qids(folder)                                      # ids of questions that got no graph

Each reader takes a Location, or a plain path or URI (a Location of the default store, `located`).

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
from xh.storage.jsonfiles import InputFileError
from xh.storage.store import Location, located
from xh.storage.tables import GRAPHS


def shard_name(shard: int) -> str:
    return f"part-{shard:05d}.parquet"


def write_shard(rows: list[dict], folder: Location, shard: int, schema: pa.Schema = schemas.GRAPHS) -> str:
    """Write rows (cast to `schema`) as one Parquet file of `folder`; returns its URI."""
    file = folder.join(shard_name(shard))
    fs, path = file.fs_path()
    fs.create_dir(folder.fs_path()[1], recursive=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, filesystem=fs)
    return file.uri


def _existing(folder: Location, what: str):
    """(filesystem, path) of a complete graphs folder (one with `_complete.json`, see `xh.storage.tables`) whose
    files hold every GRAPHS column; a one-line error otherwise (`FileNotFoundError` for a build that
    failed or was interrupted, `InputFileError` for a missing column), before any worker reads it."""
    folder.require_complete(what, hint=" (run `xh graphs build` first)", kind=GRAPHS)
    fs, path = folder.fs_path()
    needed = schemas.GRAPHS.names
    for fragment in pads.dataset(path, filesystem=fs, format="parquet").get_fragments():
        missing = [name for name in needed if name not in fragment.physical_schema.names]
        if missing:
            raise InputFileError(
                f"{what} at {folder}: {fragment.path} lacks column(s) {', '.join(missing)} of the graphs table "
                "(rebuild it with `xh graphs build`)"
            )
    return fs, path


def require_graphs(folder: Location | str, what: str = "graphs") -> None:
    """The checks every reader of a graphs folder makes (see `_existing`), for drivers that hand the
    folder to Ray readers of their own (training)."""
    _existing(located(folder), what)


def iter_graphs(folder: Location | str, batch_rows: int = 256) -> Iterator[dict]:
    """GRAPHS rows of a folder as dicts, one Parquet batch in memory at a time, in file order."""
    fs, path = _existing(located(folder), "graphs")
    dataset = pads.dataset(path, filesystem=fs, format="parquet", schema=schemas.GRAPHS)
    for batch in dataset.to_batches(batch_size=batch_rows):
        yield from batch.to_pylist()


def read_graphs(folder: Location | str, num_cpus: float = 0.25):
    """A graphs folder as a Ray dataset of GRAPHS rows (for the trainer; `iter_graphs` reads it without Ray).

    Read tasks ask for a fraction of a CPU, so that they still run beside actors or trainers holding the rest.
    """
    import ray.data

    fs, path = _existing(located(folder), "graphs")
    return ray.data.read_parquet(path, filesystem=fs, file_extensions=["parquet"], num_cpus=num_cpus)


def read_eval_set(folder: Location | str) -> list[dict]:
    """Every row of a graphs folder with gold labels, in memory: what `xh promote` scores the models on."""
    fs, path = _existing(located(folder), "evaluation set")
    return pads.dataset(path, filesystem=fs, format="parquet").to_table().to_pylist()


def read_summary(folder: Location | str) -> dict:
    """The folder's `_summary.json` (graph settings and counts), or {} when it has none."""
    try:
        return json.loads(located(folder).join("_summary.json").read_bytes())
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


def quarantined_qids(folder: Location | str, kinds: Iterable[str] | None = None) -> list[str]:
    """Ids of the questions that the build of a graphs folder quarantined (its summary names the
    quarantine folder, reached with the folder's store); [] when there is none. Evaluation counts them as misses."""
    folder = located(folder)
    quarantine = read_summary(folder).get("quarantine")
    if not quarantine:
        return []
    fs, path = folder.store.at(quarantine).fs_path()
    if fs.get_file_info(path).type.name == "NotFound":
        return []
    table = pads.dataset(path, filesystem=fs, format="parquet", schema=schemas.QUARANTINE).to_table(columns=["raw"])
    return qids_of_quarantine(table.to_pylist(), kinds)

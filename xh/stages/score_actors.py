"""The actors of batch scoring (`xh.stages.score`): started once a run, each loading its half of the
pipeline once, then fed a finished stage's rows block by block.

Ray Data's actor pools started per dataset, after the stage's rows had been read and re-partitioned (two
more jobs, each a barrier), so a run paid two pool starts and two loads in series with four extra jobs
before its first prediction (its fixed cost, docs/results/scoring.md). Here a run starts its pools when
it starts, where the cluster has room for them and for the parse stage's tasks, so that the index and the
model load while the questions are parsed; a stage's blocks are planned from its files' footers, and
each actor reads its block's rows and writes the block's Parquet file into the stage's folder itself.

    pools = Pools(sc, use_gpu, graph_args, model_args, cluster_cpus)   # loading starts where there is room
    stages.run("graphs", lambda: StageWriter(pools.graphs(), parsed, sc.batch_size))
"""

from __future__ import annotations

import json
import logging
import time

import pyarrow as pa
import pyarrow.compute as pc

from xh import schemas
from xh.inputs.questions import InputLimits, later_files, parse_question_file, superseded_by
from xh.storage.jsonfiles import InputFileError, read_bytes
from xh.storage.store import Location, Store
from xh.storage.tables import with_quarantine

QUESTION = [pa.field("qid", pa.string()), pa.field("question", pa.string())]
PARSED = with_quarantine([*QUESTION, pa.field("type", pa.string())])
GRAPHS = with_quarantine([*QUESTION, pa.field("graph", pa.string())])  # the GRAPHS row as JSON

TASK_CPUS = 0.25  # what each Ray task of a run asks (parse, the publish plan): pools started early leave it
log = logging.getLogger("xh.score").info

RETRIES = 2  # an actor killed (out of memory) is restarted and its block run again: a block's file is written whole


# --- the parse stage's tasks (Ray Data), in this light module: a parse worker imports no MLflow ----------


def parse_files(batch: dict, store: Store | None = None, limits: InputLimits | None = None) -> pa.Table:
    """Ray Data: a batch of file URIs (of `store`, default: the environment's) -> their questions (with the
    file and position each came from) and quarantined records. The task reads the raw bytes itself: Ray's
    readers decompress by extension and fail a whole run on a truncated .bz2."""
    rows, store = [], store or Store()
    for uri in map(str, batch["uri"]):
        try:
            questions, quarantined = parse_question_file(
                uri, read_bytes(store.at(uri)), limits or InputLimits(), located=True
            )
        except InputFileError as e:  # gone or unreadable since it was listed: one row, the other files go on
            questions, quarantined = [], [{"source": uri, "position": -1, "reason": "unreadable file", "raw": str(e)}]
        rows += questions + quarantined
    return pa.Table.from_pylist(rows, schema=PARSED)


def supersede(batch: pa.Table, winners: dict[str, str]) -> pa.Table:
    """Ray Data: the parsed rows whose id a later file of the run also has become quarantine rows."""
    rows = batch.to_pylist()
    for row in rows:
        winner = winners.get(row["qid"]) if row["reason"] is None else None
        if winner is not None and row["source"] != winner:
            row["reason"] = superseded_by(winner)
            row["raw"] = json.dumps({"qid": row["qid"], "question": row["question"]})[: schemas.RAW_LIMIT]
    return pa.Table.from_pylist(rows, schema=PARSED)


def ids_in_several_files(*blocks: pa.Table) -> dict[str, str]:
    """A Ray task: the usable rows' (qid, source) blocks -> `xh.inputs.questions.later_files`."""
    return later_files(pa.concat_tables(blocks)) if blocks else {}


# --- the pools ----------------------------------------------------------------------------------------


def block_count(rows: int, batch_size: int, actors: int) -> int:
    """How many blocks a stage's `rows` go to its pool in: at most `batch_size` rows each, and a multiple of
    the pool's `actors`, so that the actors finish together. Blocks of a fixed size leave a last round in
    which one actor works and the others wait (what it cost: docs/results/scoring.md, batch scoring)."""
    blocks = -(-max(1, -(-rows // batch_size)) // actors) * actors
    return max(1, min(rows, blocks))


def plan_blocks(folder: Location, batch_size: int, actors: int) -> list[list[tuple[str, int, int]]]:
    """A finished stage's usable rows (no reason) in `block_count` equal blocks, each a list of (file path,
    first, end) over the usable rows of the stage's files in name order; from the files' footers and
    reason columns only."""
    import pyarrow.dataset as pads

    fs, path = folder.fs_path()
    dataset = pads.dataset(path, filesystem=fs, format="parquet", exclude_invalid_files=True)
    spans, total = [], 0
    for fragment in sorted(dataset.get_fragments(), key=lambda f: f.path):
        rows = fragment.count_rows(filter=pads.field("reason").is_null())
        spans.append((fragment.path, total, total + rows))
        total += rows
    if not total:
        return []
    n = block_count(total, batch_size, actors)
    bounds = [total * i // n for i in range(n + 1)]
    return [
        [(file, max(lo, a) - a, min(hi, b) - a) for file, a, b in spans if max(lo, a) < min(hi, b)]
        for lo, hi in zip(bounds, bounds[1:])
    ]


class _Worker:
    """An actor's loop: a block's usable rows read, turned into rows of the next stage, written as one file."""

    def run(self, pieces: list[tuple[str, int, int]], source_fs, target: str, target_fs) -> int:
        import pyarrow.parquet as pq

        parts = []
        for path, first, end in pieces:
            table = pq.read_table(path, filesystem=source_fs)
            parts.append(table.filter(pc.is_null(table["reason"])).slice(first, end - first))
        out = self.rows(pa.concat_tables(parts))
        pq.write_table(out, target, filesystem=target_fs)
        return out.num_rows

    def rows(self, batch: pa.Table) -> pa.Table:
        raise NotImplementedError

    def call(self, fn, *args):
        """A short task of the run in this warm process (`Pools.call`), not in a worker started for it."""
        return fn(*args)


class GraphActor(_Worker):
    """The pipeline's graph half, loaded once; questions in, graphs (or quarantine rows) out."""

    def __init__(self, **load_args):
        start = time.perf_counter()
        from xh.pipeline import Pipeline

        self.pipeline = Pipeline.load(**load_args)
        log(f"graph actor: loaded in {time.perf_counter() - start:.1f} s")

    def rows(self, batch: pa.Table) -> pa.Table:
        graphs, quarantined = self.pipeline.graphs(batch.select(["qid", "question", "type"]).to_pylist())
        rows = [{"qid": g["qid"], "question": g["question"], "graph": json.dumps(g, default=str)} for g in graphs]
        return pa.Table.from_pylist(rows + quarantined, schema=GRAPHS)


MODEL_COPY = "_copied.json"  # written last into a version's model copy (`xh.stages.score.model_copy`)


def local_folder(files: Location) -> str:
    """A local folder holding the model copy at `files`: the folder itself when it is local, else a copy on
    this node made once under a file lock (in the temp folder, named after the copy's location and marker),
    which the node's other model actors then load from."""
    import os

    marker = files.join(MODEL_COPY).read_bytes()
    folder = json.loads(marker)["folder"]  # the saved-model folder inside the copy
    if not files.is_s3:
        return os.path.join(files.fs_path()[1], folder)
    import fcntl
    import hashlib
    import shutil
    import tempfile
    from pathlib import Path

    key = hashlib.sha256(files.uri.encode() + marker).hexdigest()[:24]
    root = Path(tempfile.gettempdir(), "xh-models")
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one download per node; the others wait, then load the same files
        if not (root / key).is_dir():
            staging = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=root))
            try:
                files.download(staging)
                os.rename(staging, root / key)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return str(root / key / folder)


class ModelActor(_Worker):
    """The pipeline's model half (one registered version), loaded once; graphs in, PREDICTIONS rows out.
    It loads the version's copy the driver made (`files`, `xh.stages.score.model_copy`): no MLflow in the
    actor (its import, its tracking store and the registry cost a model actor's start several seconds)."""

    def __init__(self, files: Location, provenance: dict, batch_graphs: int, block: int, threads, cache):
        start = time.perf_counter()
        import torch

        from xh.model.variants import architecture
        from xh.pipeline import Pipeline

        if threads:  # Ray gives a fractional-CPU actor one thread
            torch.set_num_threads(threads)
        # a whole block sorted by length at once: a batch scorer has the block in hand, and a wider
        # window pads less (`xh.inference.predict_graphs`)
        self.pipeline = Pipeline.load(
            model=local_folder(files), batch_graphs=batch_graphs, sort_window=max(1, -(-block // batch_graphs))
        )
        self.provenance = provenance
        if cache:
            # DocHopper's paragraph embeddings of this version and corpus snapshot, shared by every actor and run
            architecture(self.pipeline.model).use_corpus_cache(self.pipeline.model, cache)
        log(f"model actor: loaded in {time.perf_counter() - start:.1f} s")

    def rows(self, batch: pa.Table) -> pa.Table:
        from xh.pipeline import prediction_row, question_type_of

        questions, graphs = batch["question"].to_pylist(), [json.loads(g) for g in batch["graph"].to_pylist()]
        predictions = self.pipeline.predict(graphs)
        rows = [
            prediction_row(q, p) | question_type_of(g) | self.provenance
            for q, p, g in zip(questions, predictions, graphs)
        ]
        return pa.Table.from_pylist(rows, schema=schemas.PREDICTIONS)


def start_actors(cls, count: int, options: dict, **kwargs) -> list:
    """`count` actors of `cls` (Ray options `options`), constructed with `kwargs`; loading starts now."""
    import ray

    remote = ray.remote(cls).options(max_restarts=RETRIES, max_task_retries=RETRIES, **options)
    return [remote.remote(**kwargs) for _ in range(count)]


class StageWriter:
    """What `xh.storage.tables.write_stage` writes, in place of a Ray Dataset (it calls `write_parquet`): the
    usable rows of the finished stage at `source`, in `plan_blocks`'s blocks, each turned by one of
    `actors` into the next stage's rows and written as one file `part-NNNNN.parquet`."""

    def __init__(self, actors: list, source: Location, batch_size: int):
        self.actors, self.source, self.batch_size = actors, source, batch_size

    def write_parquet(self, path: str, filesystem, **_ray_args) -> int:
        from ray.util import ActorPool

        source_fs, _ = self.source.fs_path()
        calls = [
            (pieces, f"{path}/part-{i:05d}.parquet")
            for i, pieces in enumerate(plan_blocks(self.source, self.batch_size, len(self.actors)))
        ]
        if not calls:
            return 0
        pool = ActorPool(self.actors)
        done = pool.map_unordered(lambda actor, c: actor.run.remote(c[0], source_fs, c[1], filesystem), calls)
        return sum(done)


class Pools:
    """A run's actor pools by name (`add`), each started actor by actor (`start`): a pool's first actor when
    the run starts where there is room for it besides the run's tasks (`TASK_CPUS`: actors that held every
    CPU would starve the parse stage's tasks, a run that never starts), the others once the rows to score
    are known, so that a small run loads one index and one model, not a pool of each."""

    def __init__(self, cluster_cpus: float):
        self.cpus = cluster_cpus
        self.specs: dict[str, tuple] = {}
        self.started: dict[str, list] = {}

    def add(self, name: str, cls, size: int, options: dict, **kwargs) -> None:
        self.specs[name] = (cls, size, options, kwargs)

    def held(self, wanted: dict[str, int] | None = None) -> float:
        """The CPUs the started actors reserve, or with `wanted` ({pool: actors}) those pools would reserve."""
        counts = {name: len(actors) for name, actors in self.started.items()} | (wanted or {})
        return sum(n * self.specs[name][2].get("num_cpus", 1) for name, n in counts.items())

    def wanted(self, name: str, rows: int, batch_size: int) -> int:
        """The actors worth starting for `rows`: one per block of `batch_size`, at most the pool's size."""
        return max(1, min(self.specs[name][1], -(-rows // batch_size)))

    def start(self, name: str, count: int, room: float | None = None) -> list:
        """The pool's actors, `count` of them at least (its size at most), the missing ones started now; with
        `room`, only when every started actor and these fit in `room` CPUs."""
        cls, size, options, kwargs = self.specs[name]
        have = self.started.setdefault(name, [])
        missing = min(size, count) - len(have)
        if missing > 0 and (room is None or self.held({name: len(have) + missing}) <= room):
            have += start_actors(cls, missing, options, **kwargs)
        return have

    def call(self, fn, *args):
        """`fn(*args)` in a started actor (its process and imports are warm), else in a Ray task."""
        import ray

        actors = [a for pool in self.started.values() for a in pool]
        if actors:
            return ray.get(actors[0].call.remote(fn, *args))
        return ray.get(ray.remote(num_cpus=TASK_CPUS)(fn).remote(*args))

    def stop(self, *names: str) -> None:
        """The named pools' actors ended (every pool's without names)."""
        import ray

        for name in names or list(self.started):
            for actor in self.started.pop(name, []):
                ray.kill(actor)

"""A batch-scoring partition (`<output>/run_date=D/model=NAME/version=V/`) holds every input it has scored.

    recover(partition, s3)                                   # finish or undo a publish a killed run left
    plan = plan_merge(staged, partition, kept, s3, token)    # which files go, which come (a Ray task's work)
    publish(plan, partition, s3)                             # moves and deletes, the plan recorded first

A run adds its predictions to the partition: the rows of a qid it scored again are replaced, every other
row is kept, so that two inputs scored for the same date and model (two deliveries, or a re-run of one)
both stay, and an input with nothing to score changes nothing. `replace=True` (`score.replace`) makes
the run's predictions the whole partition.

A partition file that holds a re-scored qid is rewritten without it (under `kept`, then moved in); the
other files are not touched. `publish` writes the plan into the partition (`_publishing.json`: the
names it adds and the names it removes) before it moves anything, moves every new file in, then deletes
the replaced ones, then the plan; so a run killed in between leaves a plan that `recover` (first thing
in the next run for the partition) completes when every new file is in, and otherwise undoes by
deleting the new files it had moved: either way the partition holds one row per qid again. Readers
skip `_`-prefixed files; while a publish runs they may see a replaced row and its replacement both.

A run also publishes the list of input files it scored (`_inputs-<token>.json`: URI and content digest
each) in the same plan, so that the record is in the partition exactly when the rows are;
`scored_inputs` gathers them over every run_date partition of a model version, which incremental
scoring (`score.incremental`) skips. `replace=True` removes the partition's earlier records with its rows.
"""

from __future__ import annotations

import json
import posixpath

import pyarrow as pa

from xh.storage import S3Settings, join, list_files, resolve
from xh.tables import empty_folder

PLAN = "_publishing.json"
INPUTS = "_inputs-"  # + token + ".json": the input files one run scored into the partition


def partition_path(output: str, run_date: str, model: str, version) -> str:
    return join(output, f"run_date={run_date}", f"model={model}", f"version={version}")


def _names(uri: str, s3: S3Settings | None) -> list[str]:
    """The Parquet files directly in a partition folder (none when it does not exist)."""
    return [n for n in _files(uri, s3) if n.endswith(".parquet")]


def _files(uri: str, s3: S3Settings | None) -> list[str]:
    """The names of the files directly in a folder (none when it does not exist)."""
    from pyarrow import fs as pafs

    fs, path = resolve(uri, s3)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.File)


def _records(names: list[str]) -> list[str]:
    return [n for n in names if n.startswith(INPUTS) and n.endswith(".json")]


def recover(partition: str, s3: S3Settings | None) -> str | None:
    """Complete ("finished") or undo ("undone") the publish a killed run left in `partition`; None
    when there was none."""
    fs, path = resolve(partition, s3)
    marker = f"{path}/{PLAN}"
    if fs.get_file_info(marker).type.name == "NotFound":
        return None
    with fs.open_input_stream(marker, compression=None) as f:
        plan = json.loads(f.read())
    present = set(_files(partition, s3))
    complete = set(plan["add"]) <= present
    for name in plan["remove"] if complete else plan["add"]:
        if name in present:
            fs.delete_file(f"{path}/{name}")
    fs.delete_file(marker)
    return "finished" if complete else "undone"


def plan_merge(
    staged: str,
    partition: str,
    kept: str,
    s3: S3Settings | None,
    token: str,
    replace: bool = False,
    inputs: str | None = None,
) -> dict:
    """What publishing the staged predictions (a folder of PREDICTIONS Parquet files) into `partition`
    takes: {"add": [[staged file, name in the partition], ...], "remove": [names], "rows": this run's
    rows, "replaced": rows of re-scored qids removed}. Partition files holding a qid of this run are
    rewritten without those rows into `kept` (an empty folder is made there); `token` makes this run's
    file names unique in the partition. `inputs`: the run's record of its input files
    (`write_inputs_record`), published with the rows."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    fs, kept_path = empty_folder(kept, s3)
    _, part_path = resolve(partition, s3)
    new = list_files(staged, s3, suffix=".parquet")
    new_rows = {f: pq.read_metadata(resolve(f, s3)[1], filesystem=fs).num_rows for f in new}
    old = _names(partition, s3)
    add, remove, replaced = [], [], 0
    if replace:
        remove = old
        replaced = sum(pq.read_metadata(f"{part_path}/{n}", filesystem=fs).num_rows for n in old)
    else:
        qids = _qids(new, fs, s3)
        for name in old:
            table = pq.read_table(f"{part_path}/{name}", filesystem=fs)
            hit = pc.is_in(table["qid"], value_set=qids)
            if not pc.any(hit).as_py():
                continue
            keep = table.filter(pc.invert(hit))
            remove.append(name)
            replaced += table.num_rows - keep.num_rows
            if keep.num_rows:
                target = f"kept-{token}-{name}"
                pq.write_table(keep, f"{kept_path}/{target}", filesystem=fs)
                add.append([join(kept, target), target])
    # an empty result adds a file only where the partition would otherwise have none (readers want one)
    empty_only = len(old) - len(remove) + len(add) == 0 and not any(new_rows.values())
    for f in new:
        if new_rows[f] or (empty_only and f == new[0]):
            add.append([f, f"{token}-{posixpath.basename(f)}"])
    if inputs is not None:
        if replace:
            remove += _records(_files(partition, s3))
        add.append([inputs, f"{INPUTS}{token}.json"])
    return {"add": add, "remove": remove, "rows": sum(new_rows.values()), "replaced": replaced}


def _qids(files: list[str], fs, s3: S3Settings | None) -> pa.Array:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    columns = [pq.read_table(resolve(f, s3)[1], columns=["qid"], filesystem=fs)["qid"] for f in files]
    return pc.unique(pa.chunked_array(columns, type=pa.string()))


def publish(plan: dict, partition: str, s3: S3Settings | None) -> int:
    """Move the plan's new files into the partition and delete the ones it replaces (see the module
    docstring for the order); returns the number of files added."""
    fs, path = resolve(partition, s3)
    fs.create_dir(path, recursive=True)
    record = {"add": [name for _, name in plan["add"]], "remove": plan["remove"]}
    with fs.open_output_stream(f"{path}/{PLAN}", compression=None) as out:
        out.write(json.dumps(record).encode())
    for source, name in plan["add"]:
        fs.move(resolve(source, s3)[1], f"{path}/{name}")
    for name in plan["remove"]:
        fs.delete_file(f"{path}/{name}")
    fs.delete_file(f"{path}/{PLAN}")
    return len(plan["add"])


def write_inputs_record(uri: str, files: dict[str, str], s3: S3Settings | None, **about) -> None:
    """The input files a run scored ({URI: content digest}) and `about` it, as the JSON file at `uri`."""
    fs, path = resolve(uri, s3)
    record = {**about, "files": [{"uri": u, "digest": d} for u, d in sorted(files.items())]}
    with fs.open_output_stream(path, compression=None) as out:
        out.write(json.dumps(record).encode())


def scored_inputs(output: str, model: str, version, s3: S3Settings | None) -> dict[tuple[str, str], str]:
    """(URI, content digest) -> run date of every input file a published run scored with this model
    version, over all of its run_date partitions under `output` (none when there are none)."""
    from pyarrow import fs as pafs

    fs, path = resolve(output, s3)
    dates = [
        posixpath.basename(i.path)[len("run_date=") :]
        for i in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        if i.type == pafs.FileType.Directory and posixpath.basename(i.path).startswith("run_date=")
    ]
    scored = {}
    for run_date in sorted(dates):
        partition = partition_path(output, run_date, model, version)
        _, part_path = resolve(partition, s3)
        for name in _records(_files(partition, s3)):
            with fs.open_input_stream(f"{part_path}/{name}", compression=None) as f:
                for entry in json.loads(f.read())["files"]:
                    scored[(entry["uri"], entry["digest"])] = run_date
    return scored

"""A batch-scoring partition (`<output>/run_date=D/model=NAME/version=V/`) holds every input it has scored.

    partition = partition_of(output, run_date, model, version)   # Locations of one Store, throughout
    recover(partition)                                       # finish or undo a publish a killed run left
    plan = plan_merge(staged, partition, kept, token)        # which files go, which come (a Ray task's work)
    publish(plan, partition)                                 # moves and deletes, the plan recorded first

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

from xh.store import Location
from xh.tables import empty_folder

PLAN = "_publishing.json"
INPUTS = "_inputs-"  # + token + ".json": the input files one run scored into the partition


def partition_of(output: Location, run_date: str, model: str, version) -> Location:
    return output.join(f"run_date={run_date}", f"model={model}", f"version={version}")


def _names(folder: Location) -> list[str]:
    """The Parquet files directly in a partition folder (none when it does not exist)."""
    return [n for n in _files(folder) if n.endswith(".parquet")]


def _files(folder: Location) -> list[str]:
    """The names of the files directly in a folder (none when it does not exist)."""
    from pyarrow import fs as pafs

    fs, path = folder.fs_path()
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.File)


def _records(names: list[str]) -> list[str]:
    return [n for n in names if n.startswith(INPUTS) and n.endswith(".json")]


def recover(partition: Location) -> str | None:
    """Complete ("finished") or undo ("undone") the publish a killed run left in `partition`; None
    when there was none."""
    fs, path = partition.fs_path()
    marker = f"{path}/{PLAN}"
    if fs.get_file_info(marker).type.name == "NotFound":
        return None
    plan = json.loads(partition.join(PLAN).read_bytes())
    present = set(_files(partition))
    complete = set(plan["add"]) <= present
    for name in plan["remove"] if complete else plan["add"]:
        if name in present:
            fs.delete_file(f"{path}/{name}")
    fs.delete_file(marker)
    return "finished" if complete else "undone"


def plan_merge(
    staged: Location,
    partition: Location,
    kept: Location,
    token: str,
    replace: bool = False,
    inputs: Location | None = None,
) -> dict:
    """What publishing the staged predictions (a folder of PREDICTIONS Parquet files) into `partition`
    takes: {"add": [[staged file URI, name in the partition], ...], "remove": [names], "rows": this run's
    rows, "replaced": rows of re-scored qids removed}. Partition files holding a qid of this run are
    rewritten without those rows into `kept` (an empty folder is made there); `token` makes this run's
    file names unique in the partition. `inputs`: the run's record of its input files
    (`write_inputs_record`), published with the rows."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    fs, kept_path = empty_folder(kept)
    _, part_path = partition.fs_path()
    new = staged.files(suffix=".parquet")
    new_rows = {f: pq.read_metadata(staged.store.at(f).fs_path()[1], filesystem=fs).num_rows for f in new}
    old = _names(partition)
    add, remove, replaced = [], [], 0
    if replace:
        remove = old
        replaced = sum(pq.read_metadata(f"{part_path}/{n}", filesystem=fs).num_rows for n in old)
    else:
        qids = _qids([staged.store.at(f) for f in new])
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
                add.append([kept.join(target).uri, target])
    # an empty result adds a file only where the partition would otherwise have none (readers want one)
    empty_only = len(old) - len(remove) + len(add) == 0 and not any(new_rows.values())
    for f in new:
        if new_rows[f] or (empty_only and f == new[0]):
            add.append([f, f"{token}-{posixpath.basename(f)}"])
    if inputs is not None:
        if replace:
            remove += _records(_files(partition))
        add.append([inputs.uri, f"{INPUTS}{token}.json"])
    return {"add": add, "remove": remove, "rows": sum(new_rows.values()), "replaced": replaced}


def _qids(files: list[Location]) -> pa.Array:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    columns = []
    for f in files:
        fs, path = f.fs_path()
        columns.append(pq.read_table(path, columns=["qid"], filesystem=fs)["qid"])
    return pc.unique(pa.chunked_array(columns, type=pa.string()))


def publish(plan: dict, partition: Location) -> int:
    """Move the plan's new files into the partition and delete the ones it replaces (see the module
    docstring for the order); returns the number of files added."""
    fs, path = partition.fs_path()
    fs.create_dir(path, recursive=True)
    record = {"add": [name for _, name in plan["add"]], "remove": plan["remove"]}
    partition.join(PLAN).write_bytes(json.dumps(record).encode())
    for source, name in plan["add"]:
        fs.move(partition.store.at(source).fs_path()[1], f"{path}/{name}")
    for name in plan["remove"]:
        fs.delete_file(f"{path}/{name}")
    fs.delete_file(f"{path}/{PLAN}")
    return len(plan["add"])


def write_inputs_record(record: Location, files: dict[str, str], **about) -> None:
    """The input files a run scored ({URI: content digest}) and `about` it, as the JSON file `record`."""
    entries = [{"uri": u, "digest": d} for u, d in sorted(files.items())]
    record.write_bytes(json.dumps({**about, "files": entries}).encode())


def scored_inputs(output: Location, model: str, version) -> dict[tuple[str, str], str]:
    """(URI, content digest) -> run date of every input file a published run scored with this model
    version, over all of its run_date partitions under `output` (none when there are none)."""
    from pyarrow import fs as pafs

    fs, path = output.fs_path()
    dates = [
        posixpath.basename(i.path)[len("run_date=") :]
        for i in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        if i.type == pafs.FileType.Directory and posixpath.basename(i.path).startswith("run_date=")
    ]
    scored = {}
    for run_date in sorted(dates):
        partition = partition_of(output, run_date, model, version)
        for name in _records(_files(partition)):
            for entry in json.loads(partition.join(name).read_bytes())["files"]:
                scored[(entry["uri"], entry["digest"])] = run_date
    return scored

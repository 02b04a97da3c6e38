"""The Store: where the project writes, made once per run from config; every table, model folder and
file it reaches is a `Location` of it.

    store = Store.from_config(cfg)
    graphs = store.at(cfg.train.graphs)          # a Location: a URI with the settings to reach it
    graphs.require_complete("graphs")            # the marker, or a one-line error
    rows = graphs.read_dataset()                 # a Ray Dataset of its Parquet files

Built on `xh.storage.uris` (URIs, S3 settings, streams) and `xh.storage.tables` (the table protocol: a
`_complete.json` marker, staged writes swapped into place); neither imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs

from xh.storage import tables
from xh.storage.uris import (
    S3Settings,
    download_folder,
    is_s3,
    join,
    list_files,
    open_input,
    open_output,
    resolve,
    upload_folder,
)


@dataclass(frozen=True)
class Store:
    """Where the project writes: the storage root and the S3 settings, made once per run from config.

        store = Store.from_config(cfg)
        graphs = store.at(cfg.train.graphs)          # a Location: a URI with the settings to reach it
        graphs.require_complete("graphs")            # the marker, or a one-line error
        rows = graphs.read_dataset()                 # a Ray Dataset of its Parquet files

    Picklable (Ray tasks and actors get it whole); credentials never appear in its repr.
    """

    root: str = "runs/demo"
    s3: S3Settings = field(default_factory=S3Settings.from_env)

    @classmethod
    def from_config(cls, cfg) -> Store:
        storage = cfg.storage
        return cls(
            root=storage.root, s3=S3Settings.from_env(endpoint_url=storage.s3_endpoint_url, region=storage.s3_region)
        )

    def at(self, uri: str | Location, *parts: str) -> Location:
        """`uri` (a local path, file:// or s3://), with `parts` joined on, as a Location of this store."""
        return Location(join(str(uri), *parts), self)

    def under_root(self, *parts: str) -> Location:
        return self.at(self.root, *parts)

    def require_endpoint(self, uri: str) -> None:
        if is_s3(uri):
            self.s3.require_endpoint(uri)


@dataclass(frozen=True)
class Location:
    """A URI and the store that reaches it: a table folder, a model folder or a file.

    The table protocol (a `_complete.json` marker, staged writes swapped into place) is `xh.storage.tables`;
    these methods are its front door."""

    uri: str
    store: Store

    def __str__(self) -> str:
        return self.uri

    @property
    def is_s3(self) -> bool:
        return is_s3(self.uri)

    @property
    def s3(self) -> S3Settings:
        return self.store.s3

    def join(self, *parts: str) -> Location:
        return Location(join(self.uri, *parts), self.store)

    def fs_path(self) -> tuple[pafs.FileSystem, str]:
        """(filesystem, path) for pyarrow and Ray Data (`read_parquet(path, filesystem=fs)`)."""
        return resolve(self.uri, self.s3)

    def exists(self) -> bool:
        fs, path = self.fs_path()
        return fs.get_file_info(path).type != pafs.FileType.NotFound

    def open_input(self):
        return open_input(self.uri, self.s3)

    def open_output(self):
        return open_output(self.uri, self.s3)

    def read_bytes(self) -> bytes:
        with self.open_input() as f:
            return f.read()

    def write_bytes(self, data: bytes) -> None:
        with self.open_output() as f:
            f.write(data)

    def files(self, suffix: str = "") -> list[str]:
        """Every file at or under this location, as URIs, sorted; `FileNotFoundError` when nothing is there."""
        return list_files(self.uri, self.s3, suffix)

    def upload(self, local: str | Path) -> list[str]:
        return upload_folder(local, self.uri, self.s3)

    def download(self, local: str | Path) -> list[str]:
        return download_folder(self.uri, local, self.s3)

    def read_dataset(self, **read_args):
        """The Parquet files here as a (lazy) Ray Dataset."""
        import ray.data

        fs, path = self.fs_path()
        return ray.data.read_parquet(path, filesystem=fs, **read_args)

    # the table protocol (xh.storage.tables)

    def marker(self) -> dict | None:
        return tables.read_marker(self)

    def require_complete(self, what: str = "table", hint: str = "", kind: str | None = None) -> dict:
        return tables.require_complete(self, what=what, hint=hint, kind=kind)

    def staged(self, *, kind: str, stage: str | None = None, inputs: object = None):
        """Build a table here in a staging sibling, published whole (see `xh.storage.tables.staged`)."""
        return tables.staged(self, kind=kind, stage=stage, inputs=inputs)

    def check_replaceable(self, kind: str | None = None) -> None:
        """`ForeignFolderError` unless a table of `kind` may be written here (see `xh.storage.tables.check_replaceable`)."""
        tables.check_replaceable(self, kind)


def located(where: Location | str | Path) -> Location:
    """`where` as a Location: one given stays as it is; a plain path or URI becomes one of the default
    store (a local path, or s3:// with the environment's S3 settings), as in a test or a notebook."""
    return where if isinstance(where, Location) else Store().at(str(where))

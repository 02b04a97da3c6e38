"""Where tables and files live: one place that turns a URI into a filesystem and a path.

A URI is a local path (`runs/demo`, `/data/xh`, `file:///data/xh`) or `s3://bucket/prefix`.
S3 settings live in one object, `S3Settings`, read from the environment (credentials are never
taken from config files and never logged). The same object configures every consumer:

    pyarrow / Ray Data   settings.pyarrow_fs()            (read_parquet(..., filesystem=...))
    MLflow S3 artifacts  settings.env()["MLFLOW_S3_ENDPOINT_URL"]
    Ray workers          ray.init(runtime_env=settings.ray_runtime_env())   (endpoint and region only)

Example:

    fs, path = resolve("s3://xh/world/wiki")
    with open_output("s3://xh/world/summary.json") as f:
        f.write(b"{}")
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlparse

import pyarrow.fs as pafs

# Environment variables read for the S3 endpoint, first match wins. AWS_ENDPOINT_URL(_S3) is what
# boto3 and the AWS CLI read; MLFLOW_S3_ENDPOINT_URL is MLflow's own name for the same thing.
_ENDPOINT_VARS = ("XH_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL")


# Variables that show a user means AWS S3 itself when no endpoint is set: a region, or credentials the
# AWS SDKs would find (keys, a profile or credential file, workload identity, a container role).
_AWS_VARS = (
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


class StorageSettingsError(ValueError):
    """Storage settings that cannot be what the user meant (one line, naming the missing setting)."""


# Variables whose values are secrets: never put in a Ray runtime env, a job entrypoint, or MLflow.
SECRET_ENV_VARS = frozenset(
    {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_TRACKING_TOKEN",
    }
)
# Variables that name where credentials are (not what they are): safe to hand to workers.
CREDENTIAL_FILE_VARS = ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_PROFILE")


@dataclass(frozen=True)
class S3Settings:
    """Endpoint, region and credentials of an S3-compatible store.

    Credentials are excluded from `repr` and from `describe()`, so printing or logging the
    settings never leaks them.
    """

    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    # Whether AWS S3 itself is meant when no endpoint is set (see `_AWS_VARS`); otherwise an `s3://` URI
    # without an endpoint is a settings error, not a request to the public AWS endpoint.
    aws: bool = True

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, endpoint_url: str | None = None, region: str | None = None
    ) -> S3Settings:
        """Read settings from the environment; `endpoint_url`/`region` (from config) win when given."""
        env = os.environ if env is None else env
        endpoint = endpoint_url or next((env[v] for v in _ENDPOINT_VARS if env.get(v)), None)
        aws_files = [Path(env.get("HOME") or "~", ".aws", name).expanduser() for name in ("credentials", "config")]
        return cls(
            endpoint_url=endpoint,
            aws=bool(region or any(env.get(v) for v in _AWS_VARS) or any(f.is_file() for f in aws_files)),
            region=region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=env.get("AWS_ACCESS_KEY_ID"),
            secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
            session_token=env.get("AWS_SESSION_TOKEN"),
        )

    def require_endpoint(self, uri: str) -> None:
        """A one-line `StorageSettingsError` for an `s3://` URI when neither an endpoint nor AWS is configured."""
        if not self.endpoint_url and not self.aws:
            raise StorageSettingsError(
                f"{uri}: no S3 endpoint configured: set storage.s3_endpoint_url (or XH_S3_ENDPOINT_URL / "
                "AWS_ENDPOINT_URL) for an S3-compatible store, or AWS_REGION (and credentials) for AWS S3"
            )

    def pyarrow_fs(self, allow_bucket_creation: bool = False) -> pafs.S3FileSystem:
        kwargs: dict = {"region": self.region, "allow_bucket_creation": allow_bucket_creation}
        if self.endpoint_url:
            parsed = urlparse(self.endpoint_url)
            kwargs["scheme"] = parsed.scheme or "https"
            kwargs["endpoint_override"] = parsed.netloc or parsed.path
            # S3-compatible endpoints (moto, MinIO) want path-style addressing
            kwargs["force_virtual_addressing"] = False
        if self.access_key_id:
            kwargs.update(access_key=self.access_key_id, secret_key=self.secret_access_key)
            if self.session_token:
                kwargs["session_token"] = self.session_token
        return pafs.S3FileSystem(**kwargs)

    def env(self) -> dict[str, str]:
        """Environment for processes that talk to the store: Ray workers, MLflow clients and servers."""
        out = {"AWS_REGION": self.region, "AWS_DEFAULT_REGION": self.region}
        if self.endpoint_url:
            out.update(
                AWS_ENDPOINT_URL=self.endpoint_url,
                MLFLOW_S3_ENDPOINT_URL=self.endpoint_url,
                XH_S3_ENDPOINT_URL=self.endpoint_url,
            )
        if self.access_key_id:
            out.update(AWS_ACCESS_KEY_ID=self.access_key_id, AWS_SECRET_ACCESS_KEY=self.secret_access_key or "")
            if self.session_token:
                out["AWS_SESSION_TOKEN"] = self.session_token
        return out

    def ray_runtime_env(self) -> dict:
        """What Ray workers are told: the endpoint, the region and the *paths* of credential files.

        Never the keys themselves: a runtime env is shown by `ray job list` and the dashboard to anyone
        holding the cluster token, and written to Ray's log files. Workers find credentials the way the AWS
        SDKs do: workload identity (IRSA, instance profiles), or a credentials file on the node
        (`AWS_SHARED_CREDENTIALS_FILE`, e.g. a mounted Kubernetes secret); a local cluster started by
        this process inherits its environment.
        """
        public = {k: v for k, v in self.env().items() if k not in SECRET_ENV_VARS}
        public.update({k: os.environ[k] for k in CREDENTIAL_FILE_VARS if os.environ.get(k)})
        return {"env_vars": public}

    def describe(self) -> dict[str, str | bool | None]:
        """What is safe to print or log."""
        return {"endpoint_url": self.endpoint_url, "region": self.region, "credentials": bool(self.access_key_id)}


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def resolve(uri: str, s3: S3Settings | None = None) -> tuple[pafs.FileSystem, str]:
    """Return `(filesystem, path)` for a URI; local paths become absolute."""
    if is_s3(uri):
        settings = s3 or S3Settings.from_env()
        settings.require_endpoint(uri)
        return settings.pyarrow_fs(), uri[len("s3://") :].rstrip("/")
    if uri.startswith("file://"):
        uri = urlparse(uri).path
    elif "://" in uri:
        raise ValueError(f"unsupported storage URI {uri!r}: use a local path or s3://bucket/prefix")
    return pafs.LocalFileSystem(), os.path.abspath(uri)


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a URI, keeping its scheme (`s3://b/p` + `x` -> `s3://b/p/x`)."""
    if is_s3(uri):
        return "s3://" + posixpath.join(uri[len("s3://") :].rstrip("/"), *parts)
    return os.path.join(uri, *parts)


# Streams carry the bytes as they are: pyarrow would otherwise (de)compress by file extension, so a
# `.bz2` written by code that compresses itself would be compressed twice, and a truncated one would
# fail inside pyarrow instead of reaching the reader that quarantines it.


@contextmanager
def open_output(uri: str, s3: S3Settings | None = None) -> Iterator[IO[bytes]]:
    """A binary writable stream of raw bytes; parent folders are created for local paths."""
    fs, path = resolve(uri, s3)
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(posixpath.dirname(path), recursive=True)
    with fs.open_output_stream(path, compression=None) as stream:
        yield stream


@contextmanager
def open_input(uri: str, s3: S3Settings | None = None) -> Iterator[IO[bytes]]:
    """A binary readable stream of the file's raw bytes."""
    fs, path = resolve(uri, s3)
    with fs.open_input_stream(path, compression=None) as stream:
        yield stream


def list_paths(fs: pafs.FileSystem, path: str) -> list[str]:
    """All files at or under a filesystem path (recursively), sorted."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no such file or folder: {path}")
    if info.type == pafs.FileType.File:
        return [path]
    selector = pafs.FileSelector(path, recursive=True)
    return sorted(i.path for i in fs.get_file_info(selector) if i.type == pafs.FileType.File)


def list_files(uri: str, s3: S3Settings | None = None, suffix: str = "") -> list[str]:
    """All files under a URI (recursively), as URIs of the same scheme, sorted."""
    fs, path = resolve(uri, s3)
    try:
        found = list_paths(fs, path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file or folder: {uri}") from None
    prefix = "s3://" if is_s3(uri) else ""
    return [prefix + p for p in found if p.endswith(suffix)]


def upload_folder(local: str | Path, uri: str, s3: S3Settings | None = None) -> list[str]:
    """Copy every file under a local folder to `uri` (local or s3://), keeping relative paths."""
    local = Path(local)
    written = []
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        relative = path.relative_to(local).as_posix()
        with open_output(join(uri, *relative.split("/")), s3) as out, open(path, "rb") as src:
            while chunk := src.read(1 << 22):
                out.write(chunk)
        written.append(relative)
    return written


def download_folder(uri: str, local: str | Path, s3: S3Settings | None = None) -> list[str]:
    """Copy every file under `uri` (local or s3://) into a local folder, keeping relative paths; none if nothing is there."""
    fs, base = resolve(uri, s3)
    try:
        files = list_paths(fs, base)
    except FileNotFoundError:
        return []
    relatives = [path[len(base) :].lstrip("/") for path in files]
    for path, relative in zip(files, relatives):
        target = Path(local, *relative.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        with fs.open_input_stream(path, compression=None) as src, open(target, "wb") as out:
            while chunk := src.read(1 << 22):
                out.write(chunk)
    return relatives

"""`xh.train.worker.checkpoint_folder`: each reader of a remote checkpoint gets its own folder."""

from pathlib import Path

import pyarrow.fs
import pytest
from ray.train import Checkpoint

from xh.train.worker import checkpoint_folder


def _remote_checkpoint(root: Path) -> Checkpoint:
    """A checkpoint on a filesystem that is not pyarrow's LocalFileSystem, so Ray treats it as remote."""
    (root / "ckpt" / "model").mkdir(parents=True)
    (root / "ckpt" / "model" / "tokenizer.json").write_text('{"version": "1.0"}')
    (root / "ckpt" / "progress.json").write_text('{"step": 3}')
    return Checkpoint("ckpt", filesystem=pyarrow.fs.SubTreeFileSystem(str(root), pyarrow.fs.LocalFileSystem()))


def test_two_readers_of_a_remote_checkpoint_never_share_a_folder(tmp_path):
    checkpoint = _remote_checkpoint(tmp_path)
    with checkpoint_folder(checkpoint) as first:
        # A second reader (another rank on the node) downloads while the first still reads: with
        # Checkpoint.as_directory() both would be one folder, rewritten under the first reader.
        with checkpoint_folder(checkpoint) as second:
            assert Path(second) != Path(first)
            assert (Path(second) / "model" / "tokenizer.json").read_text() == '{"version": "1.0"}'
        assert not Path(second).exists()
        assert (Path(first) / "model" / "tokenizer.json").read_text() == '{"version": "1.0"}'
        assert (Path(first) / "progress.json").read_text() == '{"step": 3}'
    assert not Path(first).exists()


def test_a_kept_download_outlives_the_block_and_a_local_checkpoint_is_read_in_place(tmp_path):
    with checkpoint_folder(_remote_checkpoint(tmp_path / "remote"), keep=True) as kept:
        pass
    assert (Path(kept) / "progress.json").read_text() == '{"step": 3}'

    local = tmp_path / "local"
    local.mkdir()
    (local / "progress.json").write_text("{}")
    with checkpoint_folder(Checkpoint.from_directory(str(local))) as folder:
        assert Path(folder) == local
    assert (local / "progress.json").exists()


def test_a_failed_read_removes_even_a_kept_download(tmp_path):
    seen = []
    try:
        with checkpoint_folder(_remote_checkpoint(tmp_path), keep=True) as folder:
            seen.append(folder)
            raise KeyError("progress")
    except KeyError:
        pass
    assert seen and not Path(seen[0]).exists()


def test_fault_injection_is_no_setting_and_not_in_the_package():
    """Tests stop a worker by patching the loop's per-step hook (tests/integration/test_train.py)."""
    import inspect

    import xh.train.loop
    from xh.config import ConfigError, load_config

    assert "_exit" not in inspect.getsource(xh.train.loop)
    with pytest.raises(ConfigError, match="unknown config key 'train.fail_at_step'"):
        load_config(None, ["train.fail_at_step=3"])

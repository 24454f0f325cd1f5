"""Disk full while writing a checkpoint (a 2 MiB tmpfs): a clear CheckpointError, no partial
save left behind, earlier checkpoints restore exactly, and later saves work again."""

import pytest

from tests.reliability import killkit


@pytest.fixture
def small_disk(tmp_path):
  disk = tmp_path / "disk"
  disk.mkdir()
  why = killkit.mount_small_disk(str(disk))
  if why:
    pytest.skip(f"cannot mount a small filesystem here (needs root): {why}")
  yield str(disk)
  killkit.unmount(str(disk))


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_disk_full_checkpoint(small_disk, async_save):
  o = killkit.checkpoint_disk_full(small_disk, async_save)
  assert o.ok, f"{o.detail}; leftovers {o.leaked}"

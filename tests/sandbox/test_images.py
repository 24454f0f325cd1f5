"""Base image builds against a real Docker engine: concurrent callers build and import once.

The rootfs builder is swapped for one that writes a tiny tarball slowly (debootstrap takes a
minute), so the callers overlap for certain; the import, the tag and the engine are real.
"""

import concurrent.futures
import io
import os
import tarfile
import threading
import time
import uuid

import pytest

from legorl_jax.sandbox import images
from tests.sandbox.test_docker_sandbox import _engine

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def client():
  return _engine()


def _tiny_rootfs(tarball: str):
  """Stands in for debootstrap's rootfs (a minute): a tarball holding one small file."""
  data = b"built once\n"
  info = tarfile.TarInfo("etc/legorl-test")
  info.size = len(data)
  with tarfile.open(tarball, "w") as tar:
    tar.addfile(info, io.BytesIO(data))


def test_concurrent_callers_build_the_image_once(client, tmp_path, monkeypatch):
  calls = []
  active = threading.Semaphore(1)

  def slow_build(tarball, suite, packages, variant, mirror):
    assert active.acquire(blocking=False), "two builds of one recipe ran at the same time"
    try:
      calls.append(tarball)
      time.sleep(0.5)
      _tiny_rootfs(tarball)
    finally:
      active.release()

  monkeypatch.setattr(images, "_build_rootfs_tar", slow_build)
  mirror = f"http://unused.invalid/{uuid.uuid4().hex}"  # a recipe no engine has seen
  tag = f"{images.IMAGE_REPO}:{images.recipe_hash('bookworm', ('python3', 'git'), 'minbase', mirror)}"
  try:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      tags = list(pool.map(lambda _: images.ensure_base_image(client, mirror=mirror,
                                                              cache_dir=str(tmp_path)), range(4)))
    assert tags == [tag] * 4
    assert len(calls) == 1
    assert images.image_exists(client, tag)
    assert sorted(os.listdir(tmp_path)) == sorted(  # no stray partial tarballs
        [os.path.basename(calls[0]), os.path.basename(calls[0])[:-len(".tar")] + ".lock"])
  finally:
    if images.image_exists(client, tag):
      client.images.remove(tag, force=True)


def test_rootfs_tarball_is_built_once_without_an_engine(client, tmp_path, monkeypatch):
  """``ensure_rootfs_tarball`` (what ``.ci/setup_system.sh`` runs before the SDK is installed)
  builds the tarball under the recipe's name, once; a later ``ensure_base_image`` of the same
  recipe imports that tarball instead of building again."""
  calls = []

  def build(tarball, suite, packages, variant, mirror):
    calls.append(tarball)
    _tiny_rootfs(tarball)

  monkeypatch.setattr(images, "_build_rootfs_tar", build)
  mirror = f"http://unused.invalid/{uuid.uuid4().hex}"
  h = images.recipe_hash("bookworm", ("python3", "git"), "minbase", mirror)
  first = images.ensure_rootfs_tarball(mirror=mirror, cache_dir=str(tmp_path))
  assert first == str(tmp_path / f"rootfs-{h}.tar") and calls == [first]
  assert images.ensure_rootfs_tarball(mirror=mirror, cache_dir=str(tmp_path)) == first
  try:
    assert images.ensure_base_image(client, mirror=mirror, cache_dir=str(tmp_path)) == \
        f"{images.IMAGE_REPO}:{h}"
    assert calls == [first]
  finally:
    if images.image_exists(client, f"{images.IMAGE_REPO}:{h}"):
      client.images.remove(f"{images.IMAGE_REPO}:{h}", force=True)

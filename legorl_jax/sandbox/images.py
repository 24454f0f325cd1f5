"""Docker images without a registry: a base image built from a debootstrap rootfs.

``ensure_base_image`` returns the tag of a Debian image with Python 3 and git, building it
once with ``debootstrap`` and ``docker import``. The tag carries a hash of the recipe, so a
changed recipe builds a new image and an unchanged one is found again in milliseconds. The
rootfs tarball is also kept in a cache directory, so a fresh Docker engine re-imports it
without downloading anything. Concurrent callers (the trials of a group on a fresh machine,
several processes) build it once: a process lock and a lock file serialise the build, and the
tarball is written under a private name before it is moved into place.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading

from legorl_jax.errors import SandboxError

log = logging.getLogger(__name__)

IMAGE_REPO = "legorl/base"
RECIPE_VERSION = 1
# The default recipe: Debian bookworm, minbase, with Python 3 and git.
SUITE, PACKAGES, VARIANT = "bookworm", ("python3", "git"), "minbase"
_BUILD_LOCK = threading.Lock()  # one build per process at a time; the lock file covers processes


def default_cache_dir() -> str:
  return os.path.join(os.path.expanduser("~"), ".cache", "legorl_jax", "images")


def recipe_hash(suite: str, packages: tuple[str, ...], variant: str, mirror: str | None) -> str:
  recipe = {"v": RECIPE_VERSION, "suite": suite, "packages": sorted(packages), "variant": variant,
            "mirror": mirror}
  return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def image_exists(client, tag: str) -> bool:
  import docker
  try:
    client.images.get(tag)
    return True
  except docker.errors.ImageNotFound:
    return False


def ensure_base_image(client, *, suite: str = SUITE, packages: tuple[str, ...] = PACKAGES,
                      variant: str = VARIANT, mirror: str | None = None,
                      cache_dir: str | None = None) -> str:
  """Tag of the base image, building it if needed (about a minute, needs root and debootstrap)."""
  h = recipe_hash(suite, packages, variant, mirror)
  tag = f"{IMAGE_REPO}:{h}"
  if image_exists(client, tag):
    return tag
  with _build_lock(h, cache_dir) as cache_dir:
    if image_exists(client, tag):  # another caller built it while this one waited
      return tag
    tarball = _ensure_tarball(h, cache_dir, suite, packages, variant, mirror)
    log.info("importing %s as %s", tarball, tag)
    client.api.import_image_from_file(tarball, repository=IMAGE_REPO, tag=h,
                                      changes=['CMD ["/bin/sh"]', "ENV LANG=C.UTF-8"])
  if not image_exists(client, tag):
    raise SandboxError(f"docker import of {tarball} did not produce {tag}")
  return tag


def ensure_rootfs_tarball(*, suite: str = SUITE, packages: tuple[str, ...] = PACKAGES,
                          variant: str = VARIANT, mirror: str | None = None,
                          cache_dir: str | None = None) -> str:
  """Path of the base image's rootfs tarball in the cache, built by debootstrap if missing.

  The slow part of ``ensure_base_image`` (debootstrap: ~45 s and ~40 CPU-s here), without a
  Docker engine or its SDK; the image is then imported from the tarball in seconds."""
  h = recipe_hash(suite, packages, variant, mirror)
  with _build_lock(h, cache_dir) as cache_dir:
    return _ensure_tarball(h, cache_dir, suite, packages, variant, mirror)


@contextlib.contextmanager
def _build_lock(h: str, cache_dir: str | None):
  """Serialises builds of recipe ``h`` in this process and across processes; yields the cache
  directory (created when it can be)."""
  cache_dir = cache_dir or default_cache_dir()
  try:
    os.makedirs(cache_dir, exist_ok=True)
  except OSError:  # a read-only cache that already holds the tarball still works
    pass
  with _BUILD_LOCK, _file_lock(os.path.join(cache_dir, f"rootfs-{h}.lock")):
    yield cache_dir


def _ensure_tarball(h, cache_dir, suite, packages, variant, mirror) -> str:
  tarball = os.path.join(cache_dir, f"rootfs-{h}.tar")
  if not os.path.isfile(tarball):
    _build_rootfs_tar(tarball, suite, packages, variant, mirror)
  return tarball


@contextlib.contextmanager
def _file_lock(path: str):
  """Holds an exclusive lock on ``path``; without one when the file cannot be opened (a
  read-only cache directory: nothing there can be built, so nothing can collide)."""
  try:
    f = open(path, "a")
  except OSError as e:
    log.info("no build lock at %s (%s); continuing without one", path, e)
    yield
    return
  with f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _build_rootfs_tar(tarball, suite, packages, variant, mirror):
  if shutil.which("debootstrap") is None:
    raise SandboxError("debootstrap is not installed; `apt-get install -y debootstrap` "
                       "(or pass an existing image as SandboxConfig.image)")
  if os.geteuid() != 0:
    raise SandboxError("building the base image with debootstrap needs root; run as root once, "
                       "or pass an existing image as SandboxConfig.image")
  os.makedirs(os.path.dirname(tarball), exist_ok=True)
  with tempfile.TemporaryDirectory(prefix="legorl-rootfs-") as tmp:
    rootfs = os.path.join(tmp, "rootfs")
    cmd = ["debootstrap", f"--variant={variant}", f"--include={','.join(packages)}", suite, rootfs]
    if mirror:
      cmd.append(mirror)
    log.info("building rootfs: %s", " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
      raise SandboxError(f"debootstrap failed (exit {p.returncode}): {p.stdout[-800:]} {p.stderr[-800:]}")
    # Slim it down: package caches and lists are not needed at run time.
    for d in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
      shutil.rmtree(os.path.join(rootfs, d), ignore_errors=True)
    os.makedirs(os.path.join(rootfs, "home", "agent"), exist_ok=True)
    os.chown(os.path.join(rootfs, "home", "agent"), 1000, 1000)
    fd, part = tempfile.mkstemp(prefix=os.path.basename(tarball) + ".", suffix=".part",
                                dir=os.path.dirname(tarball))
    os.close(fd)
    try:
      p = subprocess.run(["tar", "-C", rootfs, "--numeric-owner", "--exclude=./proc/*",
                          "--exclude=./sys/*", "--exclude=./dev/*", "-cf", part, "."],
                         capture_output=True, text=True)
      if p.returncode != 0:
        raise SandboxError(f"cannot archive the rootfs: {p.stderr[-500:]}")
      os.replace(part, tarball)
    finally:
      if os.path.exists(part):
        os.unlink(part)


def main() -> int:
  """``python -m legorl_jax.sandbox.images``: makes the default base image ready before it is
  needed (``.ci/setup_system.sh`` runs it, so the suite's first Docker test does not wait for
  debootstrap). Builds the rootfs tarball; imports it too when the Docker SDK is installed (the
  bare checkout's Python may not have it yet: the first ``ensure_base_image`` imports it then)."""
  logging.basicConfig(level=logging.INFO, format="images: %(message)s")
  try:
    tarball = ensure_rootfs_tarball()
  except SandboxError as e:
    print(f"images: {e}", file=sys.stderr)
    return 1
  try:
    import docker
  except ImportError:
    print(f"images: rootfs ready at {tarball}; the Docker SDK is not installed here, so the "
          "image is imported on first use")
    return 0
  print(f"images: {ensure_base_image(docker.from_env())} ready")
  return 0


if __name__ == "__main__":
  sys.exit(main())

"""The Docker image of one repository: the base image plus the project's environment.

Built once per repository and found again by its tag, which carries a hash of the base image,
the project's content hash and its EnvSpec. There is no registry: the host resolves and
builds every wheel the install needs (``pip wheel``, which may use PyPI), then a container of
the base image with no network installs them with ``pip install --no-index`` and is committed
as the image. The project is installed in development mode at the task work dir
(``pip install -e``), so its metadata and entry points exist while the code imported is
whatever the trial's work dir holds; the work dir is emptied before the commit, so nothing
of the original tree (hidden tests included) is left in the image.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import io
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile

from legorl_jax.errors import SandboxError, TaskError
from legorl_jax.sandbox import images
from legorl_jax.taskgen.repo.env_spec import EnvSpec
from legorl_jax.taskgen.repo.source import Project
from legorl_jax.tasks.schema import DEFAULT_WORKDIR

log = logging.getLogger(__name__)

RECIPE_VERSION = 1
WHEELS_DIR = "/opt/legorl-wheels"


def default_cache_dir() -> str:
  return os.path.join(os.path.expanduser("~"), ".cache", "legorl_jax", "repo_images")


def image_tag(project: Project, spec: EnvSpec, base_tag: str, workdir: str = DEFAULT_WORKDIR) -> str:
  recipe = {"v": RECIPE_VERSION, "base": base_tag, "tree": project.content_hash,
            "spec": spec.to_dict(), "workdir": workdir}
  h = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
  return f"legorl/repo-{project.slug}:{h}"


def ensure_repo_image(client, project: Project, spec: EnvSpec, *, workdir: str = DEFAULT_WORKDIR,
                      cache_dir: str | None = None, timeout_s: float = 900.0) -> str:
  """Tag of the repository's image, building it when missing; TaskError on a build error."""
  base_tag = images.ensure_base_image(client)
  tag = image_tag(project, spec, base_tag, workdir)
  if images.image_exists(client, tag):
    return tag
  cache_dir = cache_dir or default_cache_dir()
  os.makedirs(cache_dir, exist_ok=True)
  key = tag.split(":")[1]
  with _file_lock(os.path.join(cache_dir, f"{key}.lock")):
    if images.image_exists(client, tag):
      return tag
    wheels = os.path.join(cache_dir, f"wheels-{key}")
    if not os.path.isdir(wheels):
      _build_wheelhouse(project, spec, wheels, timeout_s)
    _install_and_commit(client, base_tag, tag, project, spec, wheels, workdir, timeout_s)
  return tag


@contextlib.contextmanager
def _file_lock(path):
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _pip(args: list[str], timeout_s: float, what: str) -> None:
  cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "-q"]
  try:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
  except subprocess.TimeoutExpired:
    raise TaskError(f"build error: {what} took over {timeout_s:.0f}s") from None
  if p.returncode != 0:
    raise TaskError(f"build error: {what} failed (pip exit {p.returncode}): "
                    f"{(p.stdout + p.stderr).strip()[-1200:]}")


def _build_wheelhouse(project: Project, spec: EnvSpec, dest: str, timeout_s: float) -> None:
  """Every wheel the offline install needs: the project's dependencies (with its test extras),
  the test requirements, the build backend (for the editable install) and pip itself."""
  part = tempfile.mkdtemp(prefix=os.path.basename(dest) + ".", suffix=".part", dir=os.path.dirname(dest))
  scratch = tempfile.mkdtemp(prefix="legorl-wheel-src-")
  try:
    # Build from a copy: setuptools writes build/ and *.egg-info into the tree it builds.
    src = os.path.join(scratch, "src")
    shutil.copytree(project.root, src)
    target = src + (f"[{','.join(spec.extras)}]" if spec.extras else "")
    reqs = list(spec.requirements)
    if spec.has_build_config:
      _pip(["wheel", "--wheel-dir", part, target, *reqs], timeout_s,
           f"resolving the dependencies of {project.name} ({spec.install_command})")
      _pip(["wheel", "--wheel-dir", part, *spec.build_requires], timeout_s,
           f"fetching the build backend of {project.name} ({' '.join(spec.build_requires)})")
      for w in glob.glob(os.path.join(part, "*.whl")):  # the project's own wheel: installed editable
        if os.path.basename(w).split("-")[0].lower().replace("_", "-") == \
            project.name.lower().replace("_", "-").replace(".", "-"):
          os.unlink(w)
    elif reqs:
      _pip(["wheel", "--wheel-dir", part, *reqs], timeout_s, f"fetching {' '.join(reqs)}")
    _pip(["download", "--dest", part, "--only-binary", ":all:", "--no-deps", "pip"], timeout_s,
         "fetching pip for the image")
    os.replace(part, dest)
  finally:
    shutil.rmtree(part, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)


def _tar_dir(path: str, arc_prefix: str = "") -> bytes:
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w") as tf:
    for name in sorted(os.listdir(path)):
      tf.add(os.path.join(path, name), arcname=arc_prefix + name)
  return buf.getvalue()


def _install_and_commit(client, base_tag, tag, project, spec, wheels, workdir, timeout_s):
  repo, _, version = tag.rpartition(":")
  pip_whl = sorted(glob.glob(os.path.join(wheels, "pip-*.whl")))
  if not pip_whl:
    raise TaskError(f"build error: no pip wheel in {wheels}; delete that directory and rebuild")
  pip = f"{WHEELS_DIR}/{os.path.basename(pip_whl[-1])}/pip"
  target = "." + (f"[{','.join(spec.extras)}]" if spec.extras else "")
  args = (["-e", target] if spec.has_build_config else []) + list(spec.requirements)
  install = (f"cd {shlex.quote(workdir)} && python3 {pip} install --no-index --find-links {WHEELS_DIR} "
             f"--break-system-packages --root-user-action=ignore --no-cache-dir "
             f"--disable-pip-version-check -q {' '.join(shlex.quote(a) for a in args)}")
  check = "python3 -c 'import pytest' && python3 -m pytest --version"
  cleanup = f"rm -rf {WHEELS_DIR} && find {shlex.quote(workdir)} -mindepth 1 -delete"
  container = client.containers.create(base_tag, command=["sleep", "infinity"], init=True,
                                       network_mode="none", user="0:0",
                                       labels={"legorl.build": tag})
  try:
    container.start()
    _run(container, f"mkdir -p {WHEELS_DIR} {shlex.quote(workdir)}", 60, "preparing the image")
    container.put_archive(WHEELS_DIR, _tar_dir(wheels))
    container.put_archive(workdir, _tar_dir(project.root))
    log.info("installing %s in %s: %s", project.name, tag, spec.install_command)
    _run(container, install, timeout_s, f"installing {project.name} ({spec.install_command})")
    _run(container, check, 120, "checking that pytest runs in the image")
    _run(container, cleanup, 300, "cleaning the image")
    container.stop(timeout=5)
    container.commit(repository=repo, tag=version, message=f"legorl: {project.name} {project.version}",
                     changes=['CMD ["/bin/sh"]', "ENV LANG=C.UTF-8", f"WORKDIR {workdir}"])
  except TaskError:
    raise
  except Exception as e:  # noqa: BLE001 - docker.errors.* and connection errors alike
    raise SandboxError(f"building image {tag} failed: {e}") from None
  finally:
    try:
      container.remove(force=True, v=True)
    except Exception:  # noqa: BLE001 - best effort
      pass
  if not images.image_exists(client, tag):
    raise SandboxError(f"docker commit did not produce {tag}")
  log.info("built %s", tag)


def _run(container, cmd: str, timeout_s: float, what: str) -> str:
  code, out = container.exec_run(["timeout", "-s", "KILL", str(int(timeout_s)), "/bin/sh", "-c", cmd],
                                 user="0:0")
  text = (out or b"").decode("utf-8", "replace")
  if code != 0:
    raise TaskError(f"build error: {what} failed in the image (exit {code}): {text.strip()[-1200:]}")
  return text

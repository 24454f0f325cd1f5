"""Cloud TPU launch scripts: syntax (``bash -n``), the commands ``--dry-run`` prints (checked
against the slice table, the training configs and, when gcloud is installed, gcloud's own
flag list), and that a dry run never invokes gcloud. Nothing here talks to Google Cloud."""

import functools
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from experiments.tpu import slices

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TPU_DIR = os.path.join(ROOT, "experiments", "tpu")
SCRIPTS = ("create.sh", "setup.sh", "launch.sh", "logs.sh", "stop.sh", "delete.sh")
CONFIGS = {"v5e-8": "tpu_v5e_8", "v6e-8": "tpu_v6e_8", "v5p-32": "tpu_v5p_32"}


@pytest.fixture
def sentinel_path(tmp_path):
  """A PATH whose first ``gcloud`` only records that it was called (a dry run must not)."""
  bindir = tmp_path / "bin"
  bindir.mkdir()
  marker = tmp_path / "gcloud_called"
  gcloud = bindir / "gcloud"
  gcloud.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexit 1\n")
  gcloud.chmod(0o755)
  return f"{bindir}:{os.environ['PATH']}", marker


def run_script(name, *args, path=None, env_extra=None, check=True):
  env = {k: v for k, v in os.environ.items() if k != "DRY_RUN"}
  env.update(env_extra or {})
  if path:
    env["PATH"] = path
  p = subprocess.run(["bash", os.path.join(TPU_DIR, name), *args], cwd="/", env=env,
                     capture_output=True, text=True, timeout=60)
  if check:
    assert p.returncode == 0, f"{name} {args}: rc={p.returncode}\n{p.stdout}\n{p.stderr}"
  return p


def commands(stdout):
  """The printed commands as argv lists (the dry-run output is shell-quoted)."""
  out, buf = [], ""
  for line in stdout.splitlines(keepends=True):
    buf += line
    try:
      argv = shlex.split(buf)
    except ValueError:   # a quoted argument spans lines (the remote script)
      continue
    if argv:
      out.append(argv)
    buf = ""
  assert not buf.strip(), f"unterminated command: {buf!r}"
  return out


def flag(argv, name):
  vals = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
  assert len(vals) == 1, (name, argv)
  return vals[0]


@pytest.mark.parametrize("script", SCRIPTS + ("common.sh",))
def test_bash_syntax(script):
  p = subprocess.run(["bash", "-n", os.path.join(TPU_DIR, script)], capture_output=True, text=True)
  assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("tpu", sorted(slices.SLICES))
def test_dry_run_prints_the_slice_lifecycle(tpu, sentinel_path):
  path, marker = sentinel_path
  s = slices.SLICES[tpu]
  name = f"legorl-{tpu}"

  (create,) = commands(run_script("create.sh", tpu, "--dry-run", "--spot", path=path).stdout)
  assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", name]
  assert flag(create, "accelerator-type") == s.accelerator_type
  assert flag(create, "version") == s.runtime_version
  assert flag(create, "zone") == s.zone and "--spot" in create

  tar, scp, ssh = commands(run_script("setup.sh", tpu, "--dry-run", path=path).stdout)
  assert tar[0] == "tar" and tar[tar.index("-C") + 1] == ROOT and "--exclude=.git" in tar
  assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and flag(scp, "worker") == "all"
  assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", name]
  assert flag(ssh, "worker") == "all"
  remote = flag(ssh, "command")
  subprocess.run(["bash", "-n"], input=remote, text=True, check=True)  # the remote script parses
  for needed in ('"$HOME/legorl_jax[tpu]"', "legorl_jax.harnesses.install mini-swe-agent",
                 f"snapshot_download('{s.hf_model}'", "usermod -aG docker"):
    assert needed in remote, needed

  workdir = f"gs://bucket/runs/{tpu}"
  (launch,) = commands(run_script("launch.sh", tpu, f"--workdir={workdir}", "--dry-run", "--",
                                  "--config.trainer.steps=3", "--config.harness.name=a b",
                                  path=path).stdout)
  assert flag(launch, "worker") == "all" and flag(launch, "zone") == s.zone
  remote = flag(launch, "command")
  subprocess.run(["bash", "-n"], input=remote, text=True, check=True)
  train = remote.split("nohup ", 1)[1].split(" > ", 1)[0]
  assert shlex.split(train) == [
      "python", "-m", "experiments.train", f"--config={s.config}", f"--workdir={workdir}",
      f"--config.model.checkpoint=$HOME/{slices.model_dir(tpu)}", "--config.trainer.steps=3",
      "--config.harness.name=a b"]
  assert "~/legorl_train.log" in remote and "~/legorl_train.pid" in remote

  (logs,) = commands(run_script("logs.sh", tpu, "--worker=all", "--dry-run", path=path).stdout)
  assert flag(logs, "worker") == "all" and "tail" in flag(logs, "command")
  (stop,) = commands(run_script("stop.sh", tpu, "--dry-run", path=path).stdout)
  assert flag(stop, "worker") == "all" and "legorl_train.pid" in flag(stop, "command")
  (delete,) = commands(run_script("delete.sh", tpu, "--name=mine", "--zone=europe-west4-a",
                                  "--project=proj", path=path, env_extra={"DRY_RUN": "1"}).stdout)
  assert delete[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "mine"]
  assert "--quiet" in delete and flag(delete, "zone") == "europe-west4-a"
  assert flag(delete, "project") == "proj"
  assert not marker.exists(), "a dry run invoked gcloud: " + marker.read_text()


def test_follow_and_git_source(sentinel_path):
  path, marker = sentinel_path
  cmds = commands(run_script("launch.sh", "v5e-8", "--workdir=/tmp/w", "--follow", "--dry-run",
                             path=path).stdout)
  assert len(cmds) == 2 and "tail" in flag(cmds[1], "command")
  (ssh,) = commands(run_script("setup.sh", "v6e-8", "--source=git", "--ref=v1",
                               "--repo-url=https://example.org/r.git", "--dry-run", path=path).stdout)
  assert "git clone --depth 1 --branch v1 https://example.org/r.git" in flag(ssh, "command")
  assert not marker.exists()


def test_errors_name_the_fix(tmp_path, sentinel_path):
  path, marker = sentinel_path
  p = run_script("launch.sh", "v5e-8", "--dry-run", path=path, check=False)
  assert p.returncode != 0 and "--workdir is required" in p.stderr
  p = run_script("launch.sh", "v5p-32", "--workdir=/tmp/local", "--dry-run", path=path, check=False)
  assert p.returncode != 0 and "gs://" in p.stderr
  p = run_script("create.sh", "v9-8", "--dry-run", path=path, check=False)
  assert p.returncode != 0 and "v5e-8" in p.stderr
  p = run_script("create.sh", "v5e-8", "--bogus", "--dry-run", path=path, check=False)
  assert p.returncode != 0 and "unknown flag --bogus" in p.stderr
  # Without --dry-run and without gcloud: refuse before doing anything, and say how to fix it.
  bare = tmp_path / "bare"
  bare.mkdir()
  for tool in ("bash", "dirname"):
    os.symlink(shutil.which(tool), bare / tool)
  os.symlink(sys.executable, bare / "python3")
  p = run_script("create.sh", "v5e-8", path=str(bare), check=False)
  assert p.returncode != 0 and "gcloud is not installed" in p.stderr
  assert not marker.exists()


@functools.cache
def _gcloud_flags(sub):
  p = subprocess.run(["gcloud", "compute", "tpus", "tpu-vm", sub, "--help"], capture_output=True,
                     text=True, timeout=120, env=dict(os.environ, CLOUDSDK_CORE_DISABLE_PROMPTS="1"))
  text = re.sub(r"\x1b\[[0-9;]*m", "", p.stdout)
  return set(re.findall(r"--[a-z][a-z-]+", text))


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="gcloud not installed")
def test_flags_exist_in_gcloud(sentinel_path):
  """Every flag the scripts pass is one the installed gcloud documents for that command."""
  path, _ = sentinel_path
  global_flags = {"--project", "--quiet"}
  out = "".join(run_script(s, "v5p-32", "--workdir=gs://b/r", "--spot", "--dry-run", path=path).stdout
                for s in SCRIPTS)
  seen = 0
  for argv in commands(out):
    if argv[0] != "gcloud":
      continue
    sub = argv[4]
    used = {a.split("=", 1)[0] for a in argv[5:] if a.startswith("--")}
    unknown = used - _gcloud_flags(sub) - global_flags
    assert not unknown, f"gcloud compute tpus tpu-vm {sub} has no {sorted(unknown)}"
    seen += 1
  assert seen == 7  # create, scp, 4 x ssh, delete


@pytest.mark.parametrize("tpu", sorted(CONFIGS))
def test_configs_fit_their_slice(tpu):
  from legorl_jax.trainer import config_check
  cfg = importlib.import_module(f"experiments.configs.{CONFIGS[tpu]}").get_config()
  config_check.validate(cfg)
  s = slices.SLICES[tpu]
  assert s.config == f"experiments/configs/{CONFIGS[tpu]}.py"
  assert os.path.exists(os.path.join(ROOT, s.config))
  devices = s.num_workers * s.chips_per_worker
  assert cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tensor == devices == cfg.tpu.num_devices
  shards = cfg.mesh.data * cfg.mesh.fsdp
  rows = cfg.trainer.rows_per_batch
  assert rows % (shards * cfg.trainer.micro_batches) == 0, "micro-batches must split over the shards"
  assert rows % s.num_workers == 0 and cfg.rollout.tasks_per_step % s.num_workers == 0
  assert cfg.distributed.num_processes == s.num_workers
  assert (cfg.distributed.mode == "always") == (s.num_workers > 1)
  assert cfg.sandbox.backend == "docker" and cfg.harness.name == "mini-swe-agent"
  # Memory sanity: fp32 params + Adam moments + grads, sharded over fsdp x tensor, fit in HBM.
  from legorl_jax.models import get_preset
  m = get_preset(cfg.model.preset)
  per_chip_gib = m.num_params() * 16 / (cfg.mesh.fsdp * cfg.mesh.tensor) / 2**30
  assert per_chip_gib < 0.6 * s.hbm_gib_per_chip, per_chip_gib


def test_readme_covers_every_script_and_slice():
  with open(os.path.join(TPU_DIR, "README.md")) as f:
    text = f.read()
  for script in SCRIPTS:
    assert f"{script}" in text, script
  for tpu, s in slices.SLICES.items():
    assert f"`{tpu}`" in text and s.config in text and s.accelerator_type in text

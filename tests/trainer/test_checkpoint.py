"""Checkpoints: a learner SIGKILLed mid-run and resumed ends bit-identical to an uninterrupted run."""

import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from legorl_jax import errors
from legorl_jax.trainer import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOTAL = 6


def _worker(workdir, out, trainable="all"):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  return subprocess.Popen([sys.executable, "-m", "tests.trainer.resume_worker", str(workdir),
                           str(TOTAL), str(out), trainable], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("trainable", ["all", "top:1", "lora"])
def test_kill_and_resume_is_bit_identical(tmp_path, trainable):
  full = _worker(tmp_path / "full", tmp_path / "full.npz", trainable)
  killed = _worker(tmp_path / "resumed", tmp_path / "unused.npz", trainable)
  lines = []
  for line in killed.stdout:
    lines.append(line)
    if line.startswith("saved 3"):
      killed.send_signal(signal.SIGKILL)  # maybe mid-way through an async save
      break
  killed.wait()
  assert any(l.startswith("saved 3") for l in lines), "".join(lines)
  resumed = _worker(tmp_path / "resumed", tmp_path / "resumed.npz", trainable)
  out_resumed, _ = resumed.communicate(timeout=600)
  out_full, _ = full.communicate(timeout=600)
  assert resumed.returncode == 0, out_resumed
  assert full.returncode == 0, out_full
  assert "resumed" in out_resumed, out_resumed
  a, b = np.load(tmp_path / "full.npz"), np.load(tmp_path / "resumed.npz")
  assert sorted(a.files) == sorted(b.files)
  for k in a.files:
    assert np.array_equal(a[k], b[k]), k


def test_restore_without_checkpoint_is_a_clear_error(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path / "empty"), async_save=False)
  with pytest.raises(errors.CheckpointError, match="No checkpoint"):
    ckpt.restore({"x": jnp.zeros(2)})


def test_keep_last_and_best(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path / "c"), keep=2, best_metric="solve_rate",
                                 async_save=False)
  for step, rate in [(1, 0.9), (2, 0.1), (3, 0.2), (4, 0.3)]:
    ckpt.save(step, {"w": jnp.full((3,), step, jnp.float32)}, host={"pos": step},
              metrics={"solve_rate": rate})
  ckpt.wait()
  steps = ckpt.all_steps()
  assert 1 in steps and 4 in steps and len(steps) <= 3  # best kept beside the latest
  state, host, step = ckpt.restore({"w": jnp.zeros(3)})
  assert step == 4 and host == {"pos": 4} and np.allclose(state["w"], 4)
  ckpt.close()

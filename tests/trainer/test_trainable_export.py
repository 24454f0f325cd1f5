"""``experiments.export`` of a LoRA run after an update (B != 0) and of a top:K run: the
checkpoint holds trainables only, the export merges them into the run's base model, and
``transformers`` loads the directory with logits equal to our model's (fp32, |d| <= 1e-4)."""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import common
from legorl_jax.trainer import pipeline
from legorl_jax.trainer.checkpoint import Checkpointer
from legorl_jax.trainer.learner import Learner
from tests.trainer import test_train_step as helpers

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("trainable", ["lora", "top:1"])
def test_export_merges_the_trainables_into_a_transformers_checkpoint(tmp_path, trainable):
  cfg = common.base_config()
  del cfg.mesh
  cfg.trainer.trainable, cfg.trainer.lora_rank, cfg.trainer.micro_batches = trainable, 4, 1
  cfg.optim.learning_rate = 3e-2
  model, _ = pipeline.build_policy(cfg)
  learner = Learner(model, cfg, seed=0)
  rng = np.random.default_rng(0)
  batch = dict(helpers.make_batch(seed=7))
  batch["input_ids"] = rng.integers(0, model.config.vocab_size, batch["input_ids"].shape).astype(np.int32)
  learner.update([batch])
  if trainable == "lora":
    assert max(float(np.abs(np.asarray(v)).max()) for k, v in learner.state.params.items()
               if k.endswith(".lora_b")) > 1e-4
  ckpt = Checkpointer(os.path.join(tmp_path, "checkpoints"), async_save=False)
  ckpt.save(1, learner.state, host={"phase": "rl", "rl_step": 1})
  ckpt.close()
  with open(os.path.join(tmp_path, "config.json"), "w") as f:
    f.write(cfg.to_json())
  out = os.path.join(tmp_path, "hf")
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-m", "experiments.export", f"--workdir={tmp_path}",
                         f"--out={out}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  hf = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
  ids = rng.integers(0, model.config.vocab_size, (2, 24)).astype(np.int32)
  with torch.no_grad():
    theirs = hf(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
  ours = np.asarray(learner.model()(jnp.asarray(ids)))
  base = np.asarray(model(jnp.asarray(ids)))
  assert np.abs(theirs - ours).max() <= 1e-4
  assert np.abs(theirs - base).max() > 1e-3  # the export carries the update, not the base
  assert json.load(open(os.path.join(out, "config.json")))["tie_word_embeddings"] == model.config.tie_word_embeddings

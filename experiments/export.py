r"""Exports a run's latest (or a given) checkpoint as a Hugging Face model directory.

The directory holds the merged policy, whatever ``trainer.trainable`` was: a top:K or LoRA
checkpoint holds only the trainables, so the export rebuilds the run's base model from its
config (``model.checkpoint`` / ``model.preset``), restores the trainables and writes
``W + (alpha / r) A @ B`` for every adapted kernel: ``transformers`` loads it without PEFT.

  python -m experiments.export --workdir=/tmp/legorl_demo --out=/tmp/legorl_demo/hf
  python -c "from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('/tmp/legorl_demo/hf')"
"""

import json
import os

import ml_collections
from absl import app, flags
from absl import logging as absl_logging

flags.DEFINE_string("workdir", None, "Run directory written by experiments.train.")
flags.DEFINE_string("out", None, "Output directory (default: WORKDIR/hf).")
flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
flags.mark_flags_as_required(["workdir"])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  absl_logging.set_verbosity(absl_logging.WARNING)
  from legorl_jax import errors
  from legorl_jax.models import save_pretrained
  from legorl_jax.trainer import pipeline
  from legorl_jax.trainer.checkpoint import Checkpointer
  from legorl_jax.trainer.learner import Learner

  cfg_path = os.path.join(FLAGS.workdir, "config.json")
  if not os.path.exists(cfg_path):
    raise errors.CheckpointError(f"{cfg_path} is missing: is {FLAGS.workdir} a training run directory?")
  with open(cfg_path) as f:
    cfg = ml_collections.ConfigDict(json.load(f))
  model, tokenizer = pipeline.build_policy(cfg)
  learner = Learner(model, cfg)
  ckpt = Checkpointer(os.path.join(FLAGS.workdir, "checkpoints"), async_save=False)
  learner.state, host, step = ckpt.restore(learner.state, step=FLAGS.step)
  out = FLAGS.out or os.path.join(FLAGS.workdir, "hf")
  save_pretrained(learner.model(), out, tokenizer=tokenizer)
  print(f"exported step {step} (phase {host.get('phase')}, RL step {host.get('rl_step')}, "
        f"trainable {cfg.trainer.get('trainable', 'all')}, merged) to {out}")


if __name__ == "__main__":
  app.run(main)

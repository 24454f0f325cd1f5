"""qwen3-8b on a GPU host or accelerator slice (see ``common.accelerator_config``).

Point ``model.checkpoint`` at a Hugging Face directory of the model (weights are not fetched):

  python -m experiments.train --config=experiments/configs/qwen3_8b.py --workdir=/runs/x \\
      --config.model.checkpoint=/data/qwen3-8b

Harness CLIs: ``python -m legorl_jax.harnesses.install mini-swe-agent`` on every host.
"""

from experiments.configs import common


def get_config():
  c = common.accelerator_config("qwen3-8b", tasks_per_step=64, samples_per_task=16,
                                max_len=16384)
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
  return c

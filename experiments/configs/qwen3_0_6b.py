"""qwen3-0.6b on a GPU host or accelerator slice (see ``common.accelerator_config``).

Point ``model.checkpoint`` at a Hugging Face directory of the model (weights are not fetched):

  python -m experiments.train --config=experiments/configs/qwen3_0_6b.py --workdir=/runs/x \\
      --config.model.checkpoint=/data/qwen3-0.6b

Harness CLIs: ``python -m legorl_jax.harnesses.install mini-swe-agent`` on every host.
"""

from experiments.configs import common


def get_config():
  c = common.accelerator_config("qwen3-0.6b", tasks_per_step=16, samples_per_task=8,
                                max_len=4096)
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
  return c

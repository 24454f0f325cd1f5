"""``demo_tiny`` with a mixture-of-experts policy: the ``tiny-moe`` preset (8 experts, top-2, as
many active MLP parameters per token as ``tiny``) trained with rollout routing replay.

  python -m experiments.train --config=experiments/configs/demo_tiny_moe.py --workdir=/tmp/legorl_moe

The engine records every token's routed experts (``Engine(record_routes)``, on for MoE models),
the proxy keeps them with the trajectory, and ``trainer.routing_replay`` makes the learner's
forward use them instead of recomputing top-k (issue 31). Everything else is ``demo_tiny``.
"""

from experiments.configs import demo_tiny


def get_config():
  c = demo_tiny.get_config()
  c.model.preset = "tiny-moe"
  c.trainer.routing_replay = True
  return c

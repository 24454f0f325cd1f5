"""The long RL run (issue 28): the demo's model and harness, RL on bugs without demonstrations.

  python -m experiments.train --config=experiments/configs/rl_long.py --workdir=/tmp/legorl_long

What it changes from ``demo.py``, and why:

- **The split.** Half of the training bugs (``tasks.rl_bugs_percent = 50``) get no
  demonstrations; SFT sees only the other half, and RL draws only from these. The main
  held-out set is those RL bugs under new repository names (``names_rl``); the bugs SFT had
  demonstrations for (``names_demo``) and unseen templates are reported beside it. SFT can
  only reach the main set by transfer, so a gain there is RL's own.
- **Enough trials to tell.** 16 tasks per set x 8 samples at the rollout temperature: 128
  trials per set and evaluation, pass@8 (the headroom RL can sharpen into pass@1) and the
  number of tasks the start solves sometimes but not always; evaluations are paired (the same
  seeds before and after), with a standard error beside each figure.
- **More learning per rollout.** One optimizer update per step over every kept group
  (``trainer.accumulate``), two passes (``updates_per_batch``) with the clip against the
  step-start logprobs; dynamic sampling draws up to three rounds of 8 tasks until 4 groups have
  mixed rewards, and the difficulty filter passes over bugs the policy recently always or never
  solved.
- **A rate that keeps what SFT taught.** lr 1e-4 with a KL penalty to the start policy
  (``loss.kl_coef = 0.05``): measured from the same SFT start over 8 steps, against lr 3e-4
  without it, the gain on ``names_rl`` went +3.1 -> +6.2 points and ``names_demo`` -13.3 -> +2.3
  (BENCHMARKS.md, "The first lever").
- 40 RL steps, the held-out main set every 10.
"""

from experiments.configs import demo


def get_config():
  c = demo.get_config()
  c.tasks.rl_bugs_percent = 50
  c.tasks.held_out = "names_rl"
  c.tasks.also_held_out = ("names_demo", "templates")
  c.tasks.num_val = 16
  c.eval.samples = 8
  c.eval.every = 10
  c.rollout.tasks_per_step = 4
  c.rollout.draw_tasks = 8
  c.rollout.max_draw_rounds = 3
  c.rollout.difficulty_filter = True
  c.trainer.accumulate = True
  c.trainer.updates_per_batch = 2
  c.optim.learning_rate = 1e-4
  c.loss.kl_coef = 0.05
  c.trainer.steps = 40
  c.checkpoint.every = 5
  return c

"""Issue 44's RL run: the long run's recipe with the machinery that lets a gain show.

  # 1. SFT with checkpoints along the way, then the screen picks the RL start (and temperature):
  python -m experiments.sft --config=experiments/configs/rl_gain.py --workdir=/tmp/g_sft
  python -m experiments.screen --config=experiments/configs/rl_gain.py --workdir=/tmp/g_sft
  # 2. short arms from that start (item 5), then the long run with the chosen recipe:
  python -m experiments.sweep --config=experiments/configs/rl_gain.py --workdir=/tmp/g_sweep \
      --from_screen=/tmp/g_sft/screen/screen.json --config.sweep.arms="('base', ...)"
  python -m experiments.train --config=experiments/configs/rl_gain.py --workdir=/tmp/g_rl \
      --from_screen=/tmp/g_sft/screen/screen.json

What it changes from ``rl_long.py``:

- **The main set is 32 bugs.** ``names_rl`` with one task per bug (``tasks.held_out_distinct_bugs``):
  32 RL-pool bugs under names no training task uses, 8 samples each; standard errors are
  clustered by bug, evaluations are paired (same seeds) and run every 10 steps on every held-out
  set (``eval.every_all_sets``), so each set's curve has error bars. Each evaluation is
  3 sets x 32 tasks x (8 sampled + 1 greedy) = 864 trials.
- **The pool is revisited where the signal is.** ``rollout.sampler = "pass_rate"`` replaces the
  difficulty filter: bugs drawn by the chance their group is mixed, from a per-bug solve-rate
  estimate (priors from the screen, when RL starts from it).
- **SFT saves its policy** after 20, 40, 80 and 160 steps (the screen's candidates).
- **A KL guard** (``trainer.max_kl = 0.2``): it stops a run whose policy runs away. At T=0.6
  the long run's lr 1e-4 with ``kl_coef`` 0.05 stayed at KL 0.003-0.005 (the demo that lost 13
  points on ``names_demo`` had drifted to 0.08-0.1 at lr 3e-4); from the screen's pick, T=0.8,
  the same rate reached 0.011 after one step, 0.037 after two, then held at 0.044-0.051
  (2026-12-07): the first bound, 0.05, would have stopped that run at step 11, though the KL
  term was holding it. ``names_demo`` is the forgetting guard.

Measured (2026-12-07, BENCHMARKS.md): from the screen's pick, 40 steps moved the main set
16.0 -> 28.9% (+12.9 points, paired SE 4.5, z 2.88; +2.7 / +6.2 / +11.7 after 12 / 20 / 30
steps) with ``names_demo`` +1.2 (z 0.29) and the KL at 0.036-0.063: one seed, short of +15.

The sweep (2026-12-08, BENCHMARKS.md), two 10-step arms from that start: lr 1e-4 (this config)
+2.3 points (z 1.36), KL 0.050; lr 2e-4 +5.1 (z 2.03) but KL 0.190 at step 10 and rising, near
the guard. By the issue's ranking (mixed share first) lr 1e-4 stays.

The objective options (``loss.demo_replay_weight``, ``loss.clip_eps_high``) stay as in
``rl_long.py`` until the sweep has measured them.
"""

from experiments.configs import rl_long


def get_config():
  c = rl_long.get_config()
  c.tasks.num_val = 32
  c.tasks.held_out_distinct_bugs = True
  c.eval.samples = 8
  c.eval.every = 10
  c.eval.every_all_sets = True
  c.rollout.difficulty_filter = False
  c.rollout.sampler = "pass_rate"
  c.sft.save_at = (20, 40, 80, 160)
  c.trainer.max_kl = 0.2
  c.trainer.steps = 40
  return c

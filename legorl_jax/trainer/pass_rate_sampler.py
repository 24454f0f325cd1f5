"""Pass-rate sampling: RL draws the bugs whose groups can still teach it, many times over.

A GRPO group whose samples all pass or all fail has no advantage, and a bug the policy solves
with probability p yields a mixed group of n samples with probability 1 - p^n - (1 - p)^n; the
expected squared advantage of a sample is p (1 - p). So instead of visiting a pool of bugs in
shuffled epochs (issue 44: 66 bugs, 20 steps of 4-8 tasks: ~5 visits each), this sampler keeps a
per-bug estimate of the current solve rate and draws bugs with weight ~ ``p (1 - p) + epsilon``:
the bugs in reach are revisited where the signal is, and ``epsilon`` keeps probing the ones that
look solved or hopeless (the policy moves; that is the point). It replaces the difficulty
filter (``task_filter``), which only passed over bugs whose last groups were uniform.

The estimate is an exponential moving average over the bug's groups in which the prior counts as
``prior_groups`` groups: ``p = num / den`` with ``num <- (1 - ema) num + r`` and ``den <- (1 -
ema) den + 1`` after a group with solve rate r, starting from ``num = prior * prior_groups``,
``den = prior_groups`` (``prior``, or the bug's rate in a screen's JSON, ``experiments.screen``).
Recent groups weigh most, as in a plain EMA, but an uninformed prior fades after a group or
two instead of holding a bug the policy never solves near 0.5 for several visits (a larger
``prior_groups`` trusts the prior longer: a screen's rates, say).

Two weights: ``"variance"``, ``p (1 - p) + epsilon`` (a sample's expected squared advantage),
and ``"mixed"`` (the default), ``1 - p^n - (1 - p)^n + epsilon``, the chance that a group of n
samples is mixed at all. The second is flatter across 0 < p < 1: in the toy 40-step run of
``tests/trainer/test_pass_rate_sampler.py`` (24 bugs, 8 of them movable, 8 tasks per step, 20
seeds) the least-visited movable bug got 16-20 visits with it and 8-12 with ``"variance"``. A bug is ``task_filter.task_key`` (a synthetic
bug under all its renamed variants; any other task by id); a drawn bug gives its variants in
turn. Each draw's randomness is a function of (seed, step, round) and the state (rates, visits,
variant cursors) is plain JSON checkpointed with the run, so a resumed run draws exactly what
an uninterrupted one would.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from legorl_jax import errors
from legorl_jax.trainer.task_filter import task_key
from legorl_jax.utils import safe_json


WEIGHTS = ("variance", "mixed")


class PassRateSampler:
  """Per-bug solve-rate estimates and weighted draws over an RL task pool."""

  def __init__(self, tasks: Sequence, *, prior: float = 0.5, ema: float = 0.3,
               epsilon: float = 0.02, seed: int = 0, priors: dict[str, float] | None = None,
               weight: str = "mixed", group_size: int = 8, prior_groups: float = 1.0,
               near_zero: float = 0.0, near_zero_samples: int = 16):
    if not tasks:
      raise errors.ConfigError("rollout.sampler='pass_rate' needs a non-empty RL task pool.")
    if not 0 < ema <= 1 or not 0 <= prior <= 1 or not epsilon > 0 or not prior_groups > 0:
      raise errors.ConfigError(
          f"config rollout.pass_rate (prior={prior}, ema={ema}, epsilon={epsilon}) needs 0 <= "
          "prior <= 1, 0 < ema <= 1, epsilon > 0 and prior_groups > 0.")
    if weight not in WEIGHTS:
      raise errors.ConfigError(f"config rollout.pass_rate.weight={weight!r} is invalid; choose "
                               f"one of {WEIGHTS}.")
    self.weight, self.group_size = weight, max(2, int(group_size))
    self.near_zero, self.near_zero_samples = float(near_zero), int(near_zero_samples)
    self.bugs: dict[str, list] = {}
    for t in tasks:
      self.bugs.setdefault(task_key(t), []).append(t)
    self.keys = list(self.bugs)
    self.ema, self.epsilon, self.seed = float(ema), float(epsilon), int(seed)
    priors = priors or {}
    self.rate = {k: float(np.clip(priors.get(k, prior), 0.0, 1.0)) for k in self.keys}
    self.den = {k: float(prior_groups) for k in self.keys}  # EMA weight behind each estimate
    self.visits = {k: 0 for k in self.keys}
    self.cursor = {k: 0 for k in self.keys}

  @classmethod
  def from_config(cls, tasks: Sequence, cfg) -> "PassRateSampler":
    """From ``cfg.rollout.pass_rate``; ``priors`` names a screen JSON whose per-bug rates (at
    the row of ``model.checkpoint`` and ``priors_temperature``, default
    ``sampling.temperature``; else its top-ranked row) start the estimates."""
    pr = cfg.rollout.get("pass_rate", None) or {}
    priors = None
    if pr.get("priors", ""):
      temp = float(pr.get("priors_temperature", 0.0) or cfg.sampling.temperature)
      priors = priors_from_screen(pr["priors"], cfg.model.get("checkpoint", ""), temp)
    return cls(tasks, prior=float(pr.get("prior", 0.5)), ema=float(pr.get("ema", 0.3)),
               epsilon=float(pr.get("epsilon", 0.02)), seed=int(cfg.seed), priors=priors,
               weight=str(pr.get("weight", "mixed")),
               group_size=int(cfg.rollout.samples_per_task),
               prior_groups=float(pr.get("prior_groups", 1.0)),
               near_zero=float(pr.get("near_zero", 0.0)),
               near_zero_samples=int(pr.get("near_zero_samples", 16)))

  def weights(self) -> np.ndarray:
    """float64 [n_bugs] in ``keys`` order: ``p (1 - p) + epsilon`` ("variance"), or
    ``1 - p^n - (1 - p)^n + epsilon`` ("mixed": the chance that a group of n samples has a
    signal at all, flatter than p (1 - p) across 0 < p < 1, so a bug at p = 0.15 is drawn
    nearly as often as one at 0.5)."""
    p = np.array([self.rate[k] for k in self.keys], np.float64)
    if self.weight == "mixed":
      n = self.group_size
      return 1.0 - p ** n - (1.0 - p) ** n + self.epsilon
    return p * (1.0 - p) + self.epsilon

  def draw(self, n: int, step: int, round_: int = 0, exclude: Iterable[str] = ()) -> list:
    """``n`` tasks of distinct bugs (not in ``exclude``: bugs drawn earlier in the step), drawn
    without replacement with probability proportional to ``weights``; bugs repeat only when
    the pool has fewer than ``n``. Each drawn bug gives its next variant and counts a visit."""
    rng = np.random.default_rng([self.seed, int(step), int(round_), 0x9A55])
    out = []
    exclude = set(exclude)
    while len(out) < n:
      idx = [i for i, k in enumerate(self.keys) if k not in exclude]
      if not idx:  # every bug drawn once this step: start over
        exclude, idx = set(), list(range(len(self.keys)))
      w = self.weights()[idx]
      take = rng.choice(len(idx), size=min(n - len(out), len(idx)), replace=False, p=w / w.sum())
      for j in take:
        key = self.keys[idx[j]]
        variants = self.bugs[key]
        out.append(variants[self.cursor[key] % len(variants)])
        self.cursor[key] += 1
        self.visits[key] += 1
        exclude.add(key)
    return out

  def samples_for(self, task, n: int) -> int:
    """Trials for ``task``'s group: ``near_zero_samples`` when its bug's estimate is below
    ``near_zero`` (a bug at p = 0.05 gives an 8-sample group no success 66% of the time, 16
    samples 44%), else ``n``."""
    if self.near_zero > 0 and self.rate.get(task_key(task), 1.0) < self.near_zero:
      return max(n, self.near_zero_samples)
    return n

  def record(self, task, outcomes: Sequence[int]) -> None:
    """One group of ``task`` ended with ``outcomes`` (1 solved / 0 not; policy outcomes only)."""
    if not outcomes:
      return
    key = task_key(task)
    if key not in self.rate:
      return
    r = float(np.mean(outcomes))
    num = (1.0 - self.ema) * self.rate[key] * self.den[key] + r
    self.den[key] = (1.0 - self.ema) * self.den[key] + 1.0
    self.rate[key] = num / self.den[key]

  def metrics(self) -> dict[str, float]:
    """Scalars for ``metrics.jsonl``: pool size, bugs visited, visits min/mean/max, the mean
    estimate, and how many bugs look in reach (estimate in [0.05, 0.95])."""
    v = np.array([self.visits[k] for k in self.keys], np.float64)
    p = np.array([self.rate[k] for k in self.keys], np.float64)
    return {"pool_bugs": float(len(self.keys)), "pool_bugs_visited": float((v > 0).sum()),
            "pool_visits_min": float(v.min()), "pool_visits_mean": float(v.mean()),
            "pool_visits_max": float(v.max()), "pool_rate_mean": float(p.mean()),
            "pool_bugs_in_reach": float(((p >= 0.05) & (p <= 0.95)).sum())}

  def per_bug(self) -> dict[str, dict[str, float]]:
    """{bug: {"visits", "rate"}}: the per-step log line (``rollouts/pass_rate.jsonl``)."""
    return {k: {"visits": self.visits[k], "rate": round(self.rate[k], 6)} for k in self.keys}

  def state_dict(self) -> dict:
    return {"rate": dict(self.rate), "den": dict(self.den), "visits": dict(self.visits),
            "cursor": dict(self.cursor)}

  def load_state_dict(self, state: dict | None) -> None:
    state = state or {}
    for name, conv in (("rate", float), ("den", float), ("visits", int), ("cursor", int)):
      mine = getattr(self, name)
      for k, v in (state.get(name) or {}).items():
        if k in mine:
          mine[k] = conv(v)


def priors_from_screen(path: str, checkpoint: str = "", temperature: float | None = None
                       ) -> dict[str, float]:
  """Per-bug solve rates from a screen's JSON (``experiments.screen``): the row of
  ``checkpoint`` at ``temperature`` when there is one, else the top-ranked row."""
  try:
    with open(path) as f:
      screen = safe_json.load(f)
  except (OSError, ValueError) as e:
    raise errors.ConfigError(f"config rollout.pass_rate.priors={path!r} is not a readable screen "
                             f"JSON ({e}); run experiments.screen or set it to ''.") from e
  rows = screen.get("rows") or []
  if not rows:
    raise errors.ConfigError(f"screen JSON {path} has no rows; rerun experiments.screen.")
  match = [r for r in rows if checkpoint and r.get("checkpoint") == checkpoint
           and temperature is not None and abs(float(r.get("temperature", -1)) - temperature) < 1e-9]
  row = match[0] if match else min(rows, key=lambda r: r.get("rank", 1 << 30))
  return {k: float(v) for k, v in (row.get("bug_rates") or {}).items()}

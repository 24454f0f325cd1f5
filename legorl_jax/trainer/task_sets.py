"""Which tasks each phase of a run sees: demonstrations, RL, and the held-out sets.

Synthetic runs can keep a share of the training bugs apart for RL
(``tasks.rl_bugs_percent``): those bugs get no demonstrations, and RL draws only from them, as
in the field, where tasks with tests are plentiful and demonstrations are not. The held-out
sets then measure three different things:

- ``names_rl``: the bugs RL trained on (without demonstrations), under repository names no
  training task uses: what RL is for;
- ``names_demo``: the bugs SFT had demonstrations for, under new names: SFT's home ground;
- ``templates``: (template, function) pairs no training task uses.

``names`` is every training bug under new names (the held-out set of runs without the split).
A bug is a (template, function, family, line) and keeps its side of the split under every
renamed variant (``synthetic.bug_key``), so a held-out task never shows a bug of the other
side under a new name.
"""

from __future__ import annotations

import hashlib

from legorl_jax import errors
from legorl_jax.taskgen import synthetic
from legorl_jax.taskgen.synthetic.generator import bug_key
from legorl_jax.tasks.loader import TaskLoader

HELD_OUT_MODES = ("templates", "names", "names_demo", "names_rl")


def rl_bugs_percent(cfg) -> int:
  """``tasks.rl_bugs_percent``, checked: 0 (no split) to 99."""
  p = int(cfg.tasks.get("rl_bugs_percent", 0) or 0)
  if not 0 <= p < 100:
    raise errors.ConfigError(f"config tasks.rl_bugs_percent={p} is invalid; use 0 (every bug has "
                             "demonstrations) up to 99 (the share of bugs kept for RL only).")
  if p and cfg.tasks.source != "synthetic":
    raise errors.ConfigError("config tasks.rl_bugs_percent needs tasks.source='synthetic'; a task "
                             "dataset brings its own splits, so set it to 0.")
  return p


def is_rl_bug(task, percent: int) -> bool:
  """True when ``task``'s bug is on the RL-only side of a ``percent`` split (stable: a hash of
  the bug, not of the run's seed)."""
  h = int(hashlib.sha256(f"rl-split:{bug_key(task)}".encode()).hexdigest()[:8], 16)
  return h % 100 < percent


def held_out_tasks(cfg, mode: str | None = None):
  """Synthetic validation tasks. ``mode`` (default ``tasks.held_out``): "templates" holds out
  whole (template, function) pairs; "names" holds out repositories: the training pairs' bugs
  under names (package, module, variables) that no training task uses, which measures whether
  the policy reads the repository it is given rather than recalling the ones it trained on;
  "names_rl" / "names_demo": the same, for the RL-only bugs / the bugs with demonstrations
  (needs ``tasks.rl_bugs_percent``).

  ``tasks.held_out_distinct_bugs``: a "names*" set holds at most one task per bug, so its
  ``num_val`` tasks are ``num_val`` different bugs (the pool's variants would otherwise show
  some bugs twice, under two names: fewer independent clusters for the same trials)."""
  mode = mode or cfg.tasks.get("held_out", "templates")
  n, seed, difficulty = int(cfg.tasks.num_val), int(cfg.seed), cfg.tasks.difficulty
  if mode == "templates":
    return synthetic.generate_tasks(n, seed=seed, difficulty=difficulty, split="validation")
  if mode not in HELD_OUT_MODES:
    raise errors.ConfigError(f"config tasks.held_out={mode!r} is invalid; choose one of "
                             f"{HELD_OUT_MODES}.")
  keep, subset = None, ""
  if mode in ("names_rl", "names_demo"):
    percent = rl_bugs_percent(cfg)
    if not percent:
      raise errors.ConfigError(f"held-out set {mode!r} needs tasks.rl_bugs_percent > 0 (the share "
                               "of training bugs kept for RL only); set it, or use 'names'.")
    want_rl = mode == "names_rl"
    keep, subset = (lambda t: is_rl_bug(t, percent) == want_rl), f" ({mode})"
  if cfg.tasks.get("held_out_distinct_bugs", False):
    keep, subset = _first_of_each_bug(keep), subset + " (one task per bug)"
  return synthetic.generate_tasks(n, seed=seed + 1, difficulty=difficulty, split="train",
                                  variants=2, first_variant=max(1, int(cfg.tasks.get("variants", 1))),
                                  keep=keep, subset=subset)


def _first_of_each_bug(keep):
  """A pool filter that passes what ``keep`` passes (everything when None), and of each bug
  only the first such task (the pool is scanned once, in its fixed order)."""
  seen = set()

  def first(task) -> bool:
    if keep is not None and not keep(task):
      return False
    key = bug_key(task)
    if key in seen:
      return False
    seen.add(key)
    return True

  return first


def extra_held_out_sets(cfg) -> dict[str, list]:
  """The held-out sets evaluated beside the main one (``tasks.also_held_out``, synthetic tasks
  only), by mode: e.g. a demo that holds out repository names also reports unseen templates."""
  extra = cfg.tasks.get("also_held_out", ()) or ()
  if isinstance(extra, str):
    extra = (extra,)
  # --config.tasks.also_held_out=a,b arrives as one comma-separated entry.
  extra = tuple(x.strip() for entry in extra for x in str(entry).split(",") if x.strip())
  for mode in extra:
    if mode not in HELD_OUT_MODES:
      raise errors.ConfigError(
          f"config tasks.also_held_out has {mode!r}; each entry must be one of {HELD_OUT_MODES}.")
  if extra and cfg.tasks.source != "synthetic":
    raise errors.ConfigError("config tasks.also_held_out needs tasks.source='synthetic'; set it to "
                             "() for a task dataset (its validation split is the held-out set).")
  main = cfg.tasks.get("held_out", "templates")
  return {mode: held_out_tasks(cfg, mode) for mode in extra if mode != main}


def load_tasks(cfg):
  """(RL task loader, validation tasks, demonstration tasks or None for a dataset).

  Without the split, RL and the demonstrations draw from the same training tasks; with
  ``tasks.rl_bugs_percent``, the loader holds only the RL-only bugs' tasks and the
  demonstration tasks only the others'."""
  if cfg.tasks.source == "synthetic":
    train = synthetic.generate_tasks(int(cfg.tasks.num_train), seed=int(cfg.seed),
                                     difficulty=cfg.tasks.difficulty, split="train",
                                     variants=int(cfg.tasks.get("variants", 1)))
    val = held_out_tasks(cfg)
    percent = rl_bugs_percent(cfg)
    if not percent:
      return TaskLoader(train, seed=int(cfg.seed)), val, train
    rl = [t for t in train if is_rl_bug(t, percent)]
    demo = [t for t in train if not is_rl_bug(t, percent)]
    want = int(cfg.sft.num_demos) + int(cfg.sft.get("check_demos", 0))
    if not rl or (int(cfg.sft.steps) > 0 and not cfg.sft.demos and len(demo) < want):
      raise errors.ConfigError(
          f"tasks.rl_bugs_percent={percent} leaves {len(rl)} RL-only and {len(demo)} "
          f"demonstration tasks of tasks.num_train={cfg.tasks.num_train}; SFT asks for {want} "
          "demonstrations (sft.num_demos + sft.check_demos). Raise tasks.num_train or "
          "tasks.variants, or change the percent.")
    return TaskLoader(rl, seed=int(cfg.seed)), val, demo
  loader = TaskLoader.from_tfds(cfg.tasks.source, "train", seed=int(cfg.seed))
  val_loader = TaskLoader.from_tfds(cfg.tasks.source, "validation", seed=int(cfg.seed), shuffle=False)
  val = val_loader.next_batch(min(len(val_loader), int(cfg.tasks.num_val)))
  return loader, val, None

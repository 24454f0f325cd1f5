"""RL update with the frozen trunk's states computed once per batch (``trainer.reuse_trunk``).

  python -m experiments.benchmarks.rl_trunk_reuse --model=smollm2-135m-instruct

The long RL run's update (``rl_long.py``): ``top:4``, two batches of the demo's RL layout (2
rows x 1024 tokens, loss on the second half), ``trainer.accumulate`` with two passes, so each
batch is scored once under the step-start parameters and then updated twice: three forwards of
the frozen trunk per batch without reuse, one with it. The two variants alternate ``--rounds``
times; each times its second update (the first compiles) and keeps its best; prints both, their
ratio and the largest parameter difference after the first update from the common start.
"""

from absl import app, flags

from experiments.benchmarks import common

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "smollm2-135m-instruct", "a pretrained name, HF directory or preset")
flags.DEFINE_string("trainable", "top:4", "trainer.trainable")
flags.DEFINE_integer("rows", 2, "rows per batch")
flags.DEFINE_integer("length", 1024, "tokens per row")
flags.DEFINE_integer("batches", 2, "batches per update")
flags.DEFINE_integer("passes", 2, "trainer.updates_per_batch")
flags.DEFINE_integer("rounds", 2, "alternations of the two variants (each keeps its best)")


def main(_):
  common.setup_platform()
  import numpy as np
  from experiments.configs import rl_long
  from legorl_jax.models import create_model, get_preset
  from legorl_jax.trainer import pipeline
  from legorl_jax.trainer.learner import Learner

  cfg = rl_long.get_config()
  if FLAGS.model in ("tiny", "small"):
    cfg.model.pretrained, model = "", create_model(get_preset(FLAGS.model), seed=0)
  else:
    if FLAGS.model.startswith("/"):
      cfg.model.pretrained, cfg.model.checkpoint = "", FLAGS.model
    else:
      cfg.model.pretrained = FLAGS.model
    model, _ = pipeline.build_policy(cfg)
  cfg.trainer.trainable, cfg.trainer.updates_per_batch = FLAGS.trainable, FLAGS.passes
  cfg.trainer.accumulate = True
  rng = np.random.default_rng(0)
  b, t = FLAGS.rows, FLAGS.length
  vocab = int(model.config.vocab_size)

  def batch():
    return {"input_ids": rng.integers(2, vocab, (b, t)).astype(np.int32),
            "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
            "segment_ids": np.ones((b, t), np.int32),
            "loss_mask": (np.arange(t)[None] >= t // 2).repeat(b, 0).astype(np.float32),
            "advantages": np.repeat(rng.standard_normal((b, 1)), t, 1).astype(np.float32),
            "rollout_logp": np.zeros((b, t), np.float32)}

  batches = [batch() for _ in range(FLAGS.batches)]
  best, params = {}, {}
  for _ in range(FLAGS.rounds):
    for reuse in (False, True):
      cfg.trainer.reuse_trunk = reuse
      learner = Learner(model, cfg, seed=0)
      learner.update([dict(x) for x in batches])  # compiles; from the common start
      params[reuse] = {k: np.asarray(v) for k, v in learner.trainables().items()}
      with common.Timer() as tm:  # the same work again, compiled
        learner.update([dict(x) for x in batches])
      best[reuse] = min(best.get(reuse, float("inf")), tm.wall)
  diff = max(float(np.abs(params[True][k] - params[False][k]).max()) for k in params[False])
  common.emit({"benchmark": "rl_trunk_reuse", "model": FLAGS.model, "trainable": FLAGS.trainable,
               "rows": b, "length": t, "batches": FLAGS.batches, "passes": FLAGS.passes,
               "update_s_without": round(best[False], 2), "update_s_with": round(best[True], 2),
               "ratio": round(best[False] / best[True], 3), "max_param_diff": diff,
               "load_avg_1m": common.load_avg_1m()})


if __name__ == "__main__":
  app.run(main)

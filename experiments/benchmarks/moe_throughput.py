"""Mixture-of-experts learner throughput against a dense model of equal active parameters
(issue 31). Prints one JSON line.

``tiny-moe`` (8 experts, top-2, expert width 192) and ``tiny`` (MLP width 384) have the same
attention and the same active MLP parameters per token (2 x 192 = 384 wide), so the gap is what
routing costs: the router, sorting tokens by expert, the blocked grouped matmuls' padding
(``models.moe``) and, with ``--replay``, reading the recorded routes. Both learners run
``Learner.update`` (GRPO, fp32, one optimizer update) on the same packed batch of random
sequences, alternating MoE and dense ``--repeats`` times after a warm-up, so a busy host slows
both alike; each side keeps its median. Learner tokens/s = non-padding tokens / update seconds.

  JAX_PLATFORMS=cpu python -m experiments.benchmarks.moe_throughput
  JAX_PLATFORMS=cpu python -m experiments.benchmarks.moe_throughput --rows 8 --length 512 --replay
"""

from __future__ import annotations

from absl import app, flags

from experiments.benchmarks import common

common.setup_platform()  # before jax is imported

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from legorl_jax.models import create_model, get_preset  # noqa: E402
from legorl_jax.trainer.learner import Learner  # noqa: E402

flags.DEFINE_integer("rows", 4, "Rows of the timed batch.")
flags.DEFINE_integer("length", 512, "Tokens per row.")
flags.DEFINE_integer("micro_batches", 1, "trainer.micro_batches.")
flags.DEFINE_integer("repeats", 3, "Timed updates per model (alternating).")
flags.DEFINE_bool("replay", False, "MoE learner with trainer.routing_replay (random routes).")
FLAGS = flags.FLAGS


def _cfg(replay: bool, micro: int) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.loss = ml_collections.ConfigDict(dict(name="grpo", temperature=1.0, aggregation="token-mean",
                                          clip_eps_low=0.2, clip_eps_high=0.28, vf_coef=0.0))
  c.trainer = ml_collections.ConfigDict(dict(micro_batches=micro, logprob_impl="xla",
                                             routing_replay=replay))
  c.optim = ml_collections.ConfigDict(dict(learning_rate=1e-4, schedule="constant",
                                           max_grad_norm=1.0))
  return c


def _batch(rows: int, length: int, vocab: int, routes: tuple[int, int, int] | None):
  """Random full rows, the second half of each trained; routes: (L_moe, k, E) to add some."""
  rng = np.random.default_rng(0)
  mask = np.zeros((rows, length), np.float32)
  mask[:, length // 2:] = 1
  batch = dict(input_ids=rng.integers(0, vocab, (rows, length)).astype(np.int32),
               positions=np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy(),
               segment_ids=np.ones((rows, length), np.int32), loss_mask=mask,
               advantages=rng.normal(size=(rows, length)).astype(np.float32),
               rollout_logp=np.zeros((rows, length), np.float32))
  if routes is not None:
    l_moe, k, e = routes
    r = np.argsort(rng.random((rows, length, l_moe, e)), axis=-1)[..., :k]
    batch["routed_experts"] = r.astype(np.int8)
  return batch


def main(argv):
  del argv
  args = FLAGS
  sides = {}
  for name, preset in (("moe", "tiny-moe"), ("dense", "tiny")):
    config = get_preset(preset)
    replay = args.replay and name == "moe"
    routes = ((len(config.moe_layers), config.num_experts_per_tok, config.num_experts)
              if replay else None)
    learner = Learner(create_model(config, seed=0), _cfg(replay, args.micro_batches), seed=0)
    batch = _batch(args.rows, args.length, config.vocab_size, routes)
    learner.update([batch])  # compile
    sides[name] = dict(learner=learner, batch=batch, walls=[], config=config)
  load_before = common.load_avg_1m()
  for _ in range(args.repeats):
    for side in sides.values():
      m = side["learner"].update([side["batch"]])
      side["walls"].append(m["learner_time_s"])
  tokens = args.rows * args.length
  out = {}
  for name, side in sides.items():
    c = side["config"]
    active_mlp = (c.num_experts_per_tok * c.moe_intermediate_size if c.num_experts
                  else c.intermediate_size)
    wall = common.median(side["walls"])
    out[name] = dict(preset="tiny-moe" if c.num_experts else "tiny", params=c.num_params(),
                     active_mlp_width=active_mlp, update_s_median=round(wall, 4),
                     update_s_all=[round(w, 4) for w in side["walls"]],
                     learner_tokens_per_s=round(tokens / wall, 1))
  common.emit(dict(
      benchmark="moe_throughput", backend=jax.default_backend(), rows=args.rows,
      length=args.length, tokens_per_update=tokens, replay=bool(args.replay),
      repeats=args.repeats, moe=out["moe"], dense=out["dense"],
      moe_over_dense_time=round(out["moe"]["update_s_median"] / out["dense"]["update_s_median"], 3),
      load_avg_1m_before=load_before, load_avg_1m_after=common.load_avg_1m()))


if __name__ == "__main__":
  app.run(main)

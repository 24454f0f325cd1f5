"""The RL step's rollout metrics carry the prompt tokens served from the prefix cache and the
tokens prefilled, summed over every sampler call of the step's trials."""

from legorl_jax.rollout.trajectory import Call, Trajectory
from legorl_jax.rollout.trial import TrialResult
from legorl_jax.trainer import rl_loop


def test_rollout_metrics_count_cached_and_prefilled_prompt_tokens():
  def calls(*pairs):
    return Trajectory(calls=[Call(list(range(n)), [7], [-0.1], reused_prefix_len=r) for n, r in pairs])

  results = [TrialResult("a", "t", "builtin", "solved", 1.0,
                         trajectory=calls((300, 0), (420, 299))),
             TrialResult("b", "t", "builtin", "failed", 0.0, trajectory=calls((300, 299))),
             TrialResult("c", "t", "builtin", "harness_error", 0.0)]  # no trajectory
  m = rl_loop.rollout_metrics(results, wall_s=2.0)
  assert m["prompt_tokens_cached"] == 598
  assert m["prompt_tokens_prefilled"] == 299 + 120 + 0  # prompt minus its last token, minus cached

"""legorl_jax.rl: advantage estimators, policy losses and the fused lm-head logprob op."""

from legorl_jax.rl.advantages import (ADVANTAGE_ESTIMATORS, compute_advantages, gae,
                                      whiten)
from legorl_jax.rl.aggregation import AGGREGATIONS, aggregate
from legorl_jax.rl.losses import (POLICY_LOSSES, LossConfig, policy_loss, value_loss)
from legorl_jax.rl.metrics import finalize_metrics, merge_metrics
from legorl_jax.rl.token_logprobs import (reference_token_logprobs, token_logprobs,
                                          token_logprobs_sharded)

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGGREGATIONS", "LossConfig", "POLICY_LOSSES", "aggregate",
    "compute_advantages", "finalize_metrics", "gae", "merge_metrics", "policy_loss",
    "reference_token_logprobs", "token_logprobs", "token_logprobs_sharded", "value_loss",
    "whiten",
]

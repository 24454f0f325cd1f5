"""legorl_jax.rollout."""

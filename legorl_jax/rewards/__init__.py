"""legorl_jax.rewards."""

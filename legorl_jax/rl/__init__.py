"""legorl_jax.rl."""

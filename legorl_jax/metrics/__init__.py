"""legorl_jax.metrics."""

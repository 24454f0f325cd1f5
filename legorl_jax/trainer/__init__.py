"""legorl_jax.trainer."""

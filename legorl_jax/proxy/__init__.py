"""legorl_jax.proxy."""

"""legorl_jax.sandbox."""

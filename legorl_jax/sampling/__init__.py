"""legorl_jax.sampling."""

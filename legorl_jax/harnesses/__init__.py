"""legorl_jax.harnesses."""

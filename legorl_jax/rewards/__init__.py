"""legorl_jax.rewards: hidden-test verification, rewards and reward-hacking checks."""

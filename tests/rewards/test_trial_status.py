"""Trial statuses: one list, split into policy and infrastructure outcomes."""

import pytest

from legorl_jax.rewards import status as st


def test_status_sets():
  assert st.ALL_STATUSES == {"solved", "failed", "timeout", "harness_error", "sandbox_error", "verifier_error",
                             "overlong", "reward_hack"}
  assert st.POLICY_STATUSES.isdisjoint(st.INFRASTRUCTURE_STATUSES)
  assert [s for s in sorted(st.ALL_STATUSES) if st.is_infrastructure(s)] == [
      "harness_error", "sandbox_error", "verifier_error"]
  with pytest.raises(ValueError, match="unknown trial status"):
    st.check("crashed")

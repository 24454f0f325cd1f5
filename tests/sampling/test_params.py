"""SamplingParams validation names the offending field."""

import pytest

from legorl_jax import errors
from legorl_jax.sampling import SamplingParams


@pytest.mark.parametrize("kw,field", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(stop_token_ids=(1, -2)), "stop_token_ids"),
    (dict(stop=("",)), "stop"),
    (dict(seed=-1), "seed"),
])
def test_invalid_fields_raise_config_error(kw, field):
  with pytest.raises(errors.ConfigError, match=rf"SamplingParams\.{field}="):
    SamplingParams(**kw)


def test_valid_params_normalise_sequences():
  p = SamplingParams(temperature=0, stop="END", stop_token_ids=[3, 4], seed=5)
  assert p.stop == ("END",) and p.stop_token_ids == (3, 4)

"""An SFT continuation of a run (rl_vs_sft.py) starts from the run's own warm-started policy,
whatever the run started from."""

from experiments.configs import demo
from legorl_jax.models import create_model, get_preset, save_pretrained
from legorl_jax.models import tokenizer as tok_lib
from legorl_jax.trainer import pipeline


def test_continuation_of_a_pretrained_run_loads_its_sft_policy(tmp_path):
  # The demo starts from a pretrained model's name; its continuation must load WORKDIR/sft_policy
  # (here a tiny model) without fetching anything, and leave the run's config untouched.
  cfg = demo.get_config()
  assert cfg.model.pretrained
  model = create_model(get_preset("tiny"), seed=0)
  save_pretrained(model, str(tmp_path / "sft_policy"), tokenizer=tok_lib.load_tokenizer())
  cont = pipeline.from_sft_policy(cfg, str(tmp_path))
  loaded, _ = pipeline.build_policy(cont)
  assert loaded.config.num_params() == model.config.num_params()
  assert cont.model.checkpoint == str(tmp_path / "sft_policy") and not cont.model.pretrained
  assert cfg.model.pretrained and not cfg.model.checkpoint
  assert cont.sampling.temperature == cfg.sampling.temperature  # the same evaluation as the run

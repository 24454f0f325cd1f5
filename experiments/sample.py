r"""Samples from a policy through the sampling engine and prints each token with its logprob.

  python -m experiments.sample --model=tiny --prompt="def add(a, b):"
  python -m experiments.sample --model=/path/to/hf_checkpoint --temperature=0.7

``--model`` is a preset name (random weights from ``--seed``, bundled tokenizer) or a Hugging
Face checkpoint directory (its own tokenizer).
"""

import os

from absl import app, flags

flags.DEFINE_string("model", "tiny", "Preset name or Hugging Face checkpoint directory.")
flags.DEFINE_string("prompt", "Fix the off-by-one bug in utils.py.", "User message.")
flags.DEFINE_float("temperature", 1.0, "Sampling temperature (0 = greedy).")
flags.DEFINE_integer("max_tokens", 32, "Tokens to sample.")
flags.DEFINE_integer("seed", 0, "Parameter seed for presets and the sampling seed.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from legorl_jax.models import create_model, from_pretrained, get_preset
  from legorl_jax.models import tokenizer as tok_lib
  from legorl_jax.sampling.engine import Engine
  from legorl_jax.sampling.params import SamplingParams

  if os.path.isdir(FLAGS.model):
    model, tokenizer = from_pretrained(FLAGS.model), tok_lib.load_tokenizer(FLAGS.model)
  else:
    model, tokenizer = create_model(get_preset(FLAGS.model), seed=FLAGS.seed), tok_lib.load_tokenizer()
  prompt = tok_lib.render_chat(tokenizer, [{"role": "user", "content": FLAGS.prompt}])
  params = SamplingParams(temperature=FLAGS.temperature, max_tokens=FLAGS.max_tokens,
                          stop_token_ids=tuple(tok_lib.stop_token_ids(tokenizer)), seed=FLAGS.seed)
  with Engine(model, max_batch=1, max_len=1024, prefill_buckets=(64, 256), decode_chunk=8,
              decode_fn=tokenizer) as engine:
    out = engine.generate(prompt, params)
  print(f"prompt: {len(prompt)} tokens; completion: {len(out.token_ids)} tokens "
        f"(finish_reason={out.finish_reason})")
  print(f"{'id':>6}  {'logprob':>9}  token")
  for tid, lp in zip(out.token_ids, out.logprobs):
    print(f"{tid:>6}  {lp:>9.4f}  {tokenizer.decode([tid])!r}")
  print("completion:", repr(tokenizer.decode(out.token_ids)))


if __name__ == "__main__":
  app.run(main)

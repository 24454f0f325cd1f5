r"""Where a warm-started policy loses its demonstrations: NLL by field of the tool call.

Scores held-out demonstrations (the last ``--n`` lines of a ``demos.jsonl``, which the demo's
SFT holds out for its imitation check) under a Hugging Face checkpoint, teacher-forced, and
splits the sampled tokens by the JSON field of the tool call they fall in: the protocol (chat
and tool-call syntax, tool names), ``path``, ``old`` and ``new``. On renamed task variants the
path and the names in ``old``/``new`` can only come from the instruction, so their NLL says
whether the policy copies or guesses.

  python -m experiments.demo_fields --checkpoint=RUN/sft_policy --demos=RUN/sft_demos/demos.jsonl
"""

import argparse
import json
import re

import numpy as np

FIELDS = ("path", "old", "new")


def field_spans(text: str) -> dict[str, tuple[int, int]]:
  """Character spans of the first ``"field": "..."`` string value of each of FIELDS."""
  spans = {}
  for f in FIELDS:
    m = re.search(r'"%s": "((?:[^"\\]|\\.)*)"' % f, text)
    if m:
      spans[f] = m.span(1)
  return spans


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--checkpoint", required=True)
  p.add_argument("--demos", required=True)
  p.add_argument("--n", type=int, default=32)
  args = p.parse_args()
  import jax
  import jax.numpy as jnp
  from legorl_jax.models import from_pretrained
  from legorl_jax.models.tokenizer import load_tokenizer

  tok = load_tokenizer(args.checkpoint)
  model = from_pretrained(args.checkpoint)
  with open(args.demos) as f:
    lines = [line for line in f if line.strip()][-args.n:]
  totals: dict[str, list[float]] = {}
  for line in lines:
    for seg in json.loads(line)["segments"]:
      ids = np.asarray(seg["token_ids"], np.int32)
      mask = np.asarray(seg["loss_mask"])
      logp = jax.nn.log_softmax(model(jnp.asarray(ids[None, :-1]))[0], axis=-1)
      target_logp = np.asarray(jnp.take_along_axis(logp, jnp.asarray(ids[1:, None]), axis=-1)[:, 0])
      argmax_hit = np.asarray(jnp.argmax(logp, axis=-1)) == ids[1:]
      pieces = [tok.decode([int(t)]) for t in ids]
      starts = np.cumsum([0] + [len(s) for s in pieces])
      spans = field_spans("".join(pieces))
      for i in np.nonzero(mask)[0]:
        if i == 0:
          continue
        field = next((f for f, (a, b) in spans.items() if a <= starts[i] < b), "protocol")
        t = totals.setdefault(field, [0.0, 0, 0])
        t[0] -= float(target_logp[i - 1])
        t[1] += 1
        t[2] += int(argmax_hit[i - 1])
  out = {"checkpoint": args.checkpoint, "demos": len(lines), "fields": {
      f: {"tokens_per_demo": round(n / len(lines), 2), "nll_per_token": round(nll / n, 3),
          "nll_per_demo": round(nll / len(lines), 2), "argmax_accuracy": round(hit / n, 3)}
      for f, (nll, n, hit) in totals.items()}}
  print(json.dumps(out))


if __name__ == "__main__":
  main()

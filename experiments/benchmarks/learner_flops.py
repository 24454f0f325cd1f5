"""Dense-matmul FLOP counts of one learner step, the denominators of the learner benchmarks'
fraction-of-peak figures: a plain row, grouped rows (one prompt, several branches) and a
``trainer.trainable`` plan (only the trained part's weight gradients count)."""


def block_matmul_weights(d: int, f: int, h: int, hkv: int, dh: int) -> int:
  """Weights of one dense block's matmuls: q, k, v, o and the SwiGLU MLP's three."""
  return d * h * dh + 2 * d * hkv * dh + h * dh * d + 3 * d * f


def step_flops(shape: dict, batch: int, seq_len: int) -> float:
  """Dense learner FLOPs of one step (see the module docstring)."""
  d, f, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
  h, hkv, dh, nl = shape["num_heads"], shape["num_kv_heads"], shape["head_dim"], shape["num_layers"]
  per_layer = block_matmul_weights(d, f, h, hkv, dh)
  n = nl * per_layer + d * v * (1 if shape["tie_word_embeddings"] else 2)
  tokens = batch * seq_len
  return 6.0 * n * tokens + 12.0 * nl * h * dh * batch * seq_len ** 2


def grouped_step_flops(shape: dict, rows: int, prefix_len: int, branch_len: int, branches: int) -> float:
  """As ``step_flops`` for grouped rows: every slot of a row enters the matmuls; attention is
  the prompt against itself plus each branch against the prompt and itself."""
  d, f, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
  h, hkv, dh, nl = shape["num_heads"], shape["num_kv_heads"], shape["head_dim"], shape["num_layers"]
  per_layer = block_matmul_weights(d, f, h, hkv, dh)
  n = nl * per_layer + d * v * (1 if shape["tie_word_embeddings"] else 2)
  p, l, k = prefix_len, branch_len, branches
  tokens = rows * (p + k * l)
  pairs = rows * (p * p + k * l * (p + l))
  return 6.0 * n * tokens + 12.0 * nl * h * dh * pairs


def trainable_step_flops(mcfg, plan, batch: int, seq_len: int, scored: int) -> dict:
  """Useful FLOPs of one learner step under ``plan`` (dense matmuls; norms, softmax and the
  optimizer are negligible): forward over every block and the lm head on the ``scored``
  predictions; backward (activation gradients) through the blocks from the lowest trained
  one up, and through the lm head; weight gradients of the trained kernels (``all``: every
  block and the tied embedding as the lm head; ``top:K``: K blocks; LoRA: every adapted
  kernel's merged weight gradient plus the low-rank projections onto A and B)."""
  d, f, v = mcfg.hidden_size, mcfg.intermediate_size, mcfg.vocab_size
  h, hkv, dh, nl = mcfg.num_heads, mcfg.num_kv_heads, mcfg.head_dim, mcfg.num_layers
  shapes = {"q": d * h * dh, "k": d * hkv * dh, "v": d * hkv * dh, "o": h * dh * d,
            "gate": d * f, "up": d * f, "down": d * f}
  per_layer = sum(shapes.values())
  tokens = batch * seq_len
  attn = 4.0 * batch * seq_len ** 2 * h * dh  # QK^T and PV, forward, per layer
  head = 2.0 * d * v * scored
  lo = plan.lowest_trained_layer([f"layers.{i}." for i in range(nl)])
  n_bwd = nl - lo
  fwd = nl * (2.0 * per_layer * tokens + attn) + head
  bwd = n_bwd * (2.0 * per_layer * tokens + 2 * attn) + head
  if plan.kind == "all":
    wgrad = nl * 2.0 * per_layer * tokens + head  # the lm head's (tied: the embedding's)
  elif plan.kind == "top":
    wgrad = plan.spec.top_k * 2.0 * per_layer * tokens
  else:
    r = plan.spec.lora_rank
    targeted = sum(shapes[t] for t in plan.spec.lora_targets)
    wgrad = nl * (2.0 * targeted * tokens + 3 * 2.0 * targeted * r)  # dW, dA, dB, merge
  return {"forward": fwd, "backward": bwd + wgrad, "total": fwd + bwd + wgrad}

r"""Imports a GGUF model file (or a named pretrained model) as a Hugging Face model directory.

The directory (config.json, model.safetensors, tokenizer files with the project's ChatML tool
template) loads in plain `transformers` (no GGUF support needed) and in every entry point:
``--config.model.checkpoint=DIR`` (train, sft, eval ``--config.policy=DIR``), ``serve --model=DIR``.

  python -m experiments.import_model --gguf=SmolLM2-135M-Instruct.Q4_1.gguf --out=/tmp/smollm2
  python -m experiments.import_model --pretrained=smollm2-135m-instruct   # into the cache
"""

from absl import app, flags

flags.DEFINE_string("gguf", None, "GGUF file to import.")
flags.DEFINE_string("pretrained", None, "Named pretrained model (models.pretrained.NAMES) to "
                    "fetch and convert into ~/.cache/legorl_jax/models/NAME instead.")
flags.DEFINE_string("out", None, "Output directory (required with --gguf).")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16", "float16"],
                  "Weight dtype on disk (GGUF weights are dequantized to float32 first).")
flags.DEFINE_bool("overwrite", False, "Replace a non-empty --out directory.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from legorl_jax import errors
  from legorl_jax.models import gguf, pretrained

  if bool(FLAGS.gguf) == bool(FLAGS.pretrained):
    raise errors.ConfigError("Pass exactly one of --gguf=FILE (with --out=DIR) or "
                             "--pretrained=NAME.")
  if FLAGS.pretrained:
    print(pretrained.resolve_pretrained(FLAGS.pretrained))
    return
  if not FLAGS.out:
    raise errors.ConfigError("--out=DIR is required with --gguf.")
  file = gguf.open_gguf(FLAGS.gguf)
  print(f"importing {file.path.name}: {file.architecture} ({file.meta.get('general.name')}), "
        f"tensor types {file.tensor_types()}")
  out = gguf.convert_gguf(file, FLAGS.out, dtype=FLAGS.dtype, overwrite=FLAGS.overwrite)
  print(f"wrote {out}")


if __name__ == "__main__":
  app.run(main)

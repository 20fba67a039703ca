r"""laplax-convert (or python -m laplax.convert) --from=timm|nanochat|hf-gpt2|laplax
--to=laplax|timm|deit_mixed|dino|nanochat --in=PATH --out=DIR (laplax.convert's docstring has
the commands and formats)."""

from __future__ import annotations

import json
import sys

from absl import app, flags
from ml_collections import config_flags

from laplax import cli
from laplax import convert
from laplax.evals.offline import parse_heads

FLAGS = flags.FLAGS
flags.DEFINE_enum("from", None, list(convert.SOURCES), "What --in is.")
flags.DEFINE_enum("to", "laplax", list(convert.TARGETS), "What to write (--from=laplax: timm, "
                  "deit_mixed (the authors' fork), dino (DINO's vit_small layout) or nanochat).")
flags.DEFINE_string("in", None, "A checkpoint file (.safetensors, .pth, .pt), a nanochat "
                    "model_*.pt, a Hugging Face model directory, or a laplax workdir / export.")
flags.DEFINE_string("out", None, "Output directory.")
flags.DEFINE_string("arch", "", "timm: the model name (deit3_small_5L_patch16_224: 6 heads, "
                    "k = 5); default the checkpoint's 'arch' entry.")
flags.DEFINE_integer("num_heads", 0, "timm: heads per layer (when --arch does not say).")
flags.DEFINE_string("laplacian_heads", None, "The head spec (laplax.heads; default: --arch's "
                    "k, the nanochat model_config's laplacian_heads, else 0).")
flags.DEFINE_enum("pool", "cls", ["cls", "gap"], "timm: global_pool 'token' (cls) or 'avg' with "
                  "fc_norm=False (gap).")
flags.DEFINE_enum("task", "classification", ["classification", "dino"], "timm: the export's "
                  "task (dino: a backbone; needs --config).")
flags.DEFINE_string("part", "", "Which entry of a checkpoint holding several (DINO: teacher, "
                    "student); --from=laplax of a DINO run: teacher (default) or student.")
flags.DEFINE_string("meta", None, "nanochat: its meta_*.json (default: beside --in).")
flags.DEFINE_string("tokenizer", None, "nanochat: its tokenizer.pkl (or a laplax "
                    "tokenizer.json).")
flags.DEFINE_float("rope_theta", None, "nanochat: rotary base (default: 100000 for the "
                   "authors' fork, whose model_config has its keys; 10000 for ae0bf52's).")
flags.DEFINE_enum("nanochat", "auto", ["auto", "fork", "ae0bf52"], "--to=nanochat: the loader "
                  "the meta is for (the authors' fork at 1f70b557, or karpathy/nanochat at "
                  "ae0bf52); auto: the one that computes the model.")
flags.DEFINE_float("qk_scale", None, "nanochat: q, k scale after QK-norm (fork: 1.2; else 1).")
flags.DEFINE_enum("rope_table_dtype", "bfloat16", ["bfloat16", "float32"], "nanochat: the "
                  "dtype of its cos / sin tables (bfloat16 at ae0bf52; the fork: its compute "
                  "dtype).")
config_flags.DEFINE_config_file("config", None, "A laplax run config for the export (its "
                                "model section becomes the converted model's).",
                                lock_config=False)
flags.mark_flags_as_required(["from", "in"])


def main(argv):
  del argv
  cli.quiet_logging()

  def work():
    source, target = FLAGS["from"].value, FLAGS.to
    heads = None if FLAGS.laplacian_heads is None else parse_heads(FLAGS.laplacian_heads)
    if source == "hf-gpt2":
      convert.from_hf_gpt2(FLAGS["in"].value)
    if not FLAGS.out:
      raise ValueError("--out: the directory to write")
    if source == "laplax":
      if target == "laplax":
        raise ValueError("--from=laplax --to=laplax: a workdir's export is eval.py --export")
      written = convert.to_torch(FLAGS["in"].value, FLAGS.out, target, part=FLAGS.part or
                                 "teacher", nanochat=FLAGS.nanochat)
    elif target != "laplax":
      raise ValueError(f"--from={source} converts to laplax (--to=laplax)")
    elif source == "timm":
      written = [convert.from_timm(FLAGS["in"].value, FLAGS.out, arch=FLAGS.arch,
                                   num_heads=FLAGS.num_heads, laplacian_heads=heads,
                                   pool=FLAGS.pool, task=FLAGS.task, config=FLAGS.config,
                                   part=FLAGS.part)]
    else:
      written = [convert.from_nanochat(FLAGS["in"].value, FLAGS.out, meta=FLAGS.meta,
                                       tokenizer=FLAGS.tokenizer, rope_theta=FLAGS.rope_theta,
                                       rope_table_dtype=FLAGS.rope_table_dtype,
                                       qk_scale=FLAGS.qk_scale, laplacian_heads=heads,
                                       config=FLAGS.config)]
    print(json.dumps({"from": source, "to": target, "written": [str(p) for p in written]},
                     indent=2))

  cli.run_main(work)


def run() -> None:
  """The command (`laplax-convert`, `python -m laplax.convert`): sys.argv parsed (one `error:`
  line for a bad one), then main."""
  cli.as_main_module(__name__, __doc__)
  app.run(main, flags_parser=cli.parse_flags, argv=sys.argv)


if __name__ == "__main__":
  run()

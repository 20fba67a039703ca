r"""A CORE bundle in the DCLM layout from the offline copies in $LAPLAX_SHARED_DATA: five of
CORE's 22 tasks, for CPU studies on machines that cannot download eval_bundle.zip.

  python scripts/core_bundle.py --dest=runs/core_bundle [--shared=../shared/data]

Writes DEST/core.yaml, DEST/eval_meta_data.csv and DEST/eval_data/... (laplax.evals.lm.core
reads it as it reads the real bundle). The tasks keep DCLM's labels, few-shot counts, task types,
delimiters and random baselines (its core.yaml and eval_meta_data.csv):

  arc_easy, arc_challenge  multiple_choice, 10 shots, '\nAnswer: ', baseline 25 %
                           (the test splits; the shared rows have the bundle's fields)
  piqa                     multiple_choice, 10 shots, '\nAnswer: ', baseline 50 %
  winogrande               schema, 0 shots, baseline 50 %
  lambada_openai           language_modeling, 0 shots, baseline 0 %

The rows are the files' rows, as they are. For the full CORE, fetch the real bundle:
python -m laplax.data.fetch core --dest=DIR.
"""

import os
import pathlib
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from laplax import cli  # noqa: E402
from laplax.data import shared  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("dest", None, "the bundle folder to write (created; must not exist)")
flags.DEFINE_string("shared", None, "the shared data folder (default: $LAPLAX_SHARED_DATA, else "
                    "../shared/data next to the repository)")

# label -> (shared file, dataset_uri, shots, icl_task_type, delimiter, random baseline %)
TASKS = {
    "arc_easy": ("arc/arc_easy_test.jsonl", "world_knowledge/arc_easy.jsonl", 10,
                 "multiple_choice", "\\nAnswer: ", 25),
    "arc_challenge": ("arc/arc_challenge_test.jsonl", "world_knowledge/arc_challenge.jsonl",
                      10, "multiple_choice", "\\nAnswer: ", 25),
    "piqa": ("llmfoundry_extra/piqa.jsonl", "commonsense_reasoning/piqa.jsonl", 10,
             "multiple_choice", "\\nAnswer: ", 50),
    "winogrande": ("llmfoundry_extra/winogrande.jsonl", "language_understanding/winogrande.jsonl",
                   0, "schema", None, 50),
    "lambada_openai": ("llmfoundry_extra/lambada_openai.jsonl",
                       "language_understanding/lambada_openai.jsonl", 0, "language_modeling",
                       " ", 0),
}


def write_bundle(shared_dir: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
  """DEST (a new folder) with the five tasks of TASKS; -> DEST."""
  missing = [f for f, *_ in TASKS.values() if not (shared_dir / f).exists()]
  if missing:
    raise ValueError(f"{shared_dir / missing[0]} does not exist: point --shared at the shared "
                     "data folder")
  if dest.exists():
    raise ValueError(f"--dest={dest} exists: give a new folder")
  tmp = dest.with_name(dest.name + ".partial")
  shutil.rmtree(tmp, ignore_errors=True)
  yaml, meta = ["icl_tasks:"], ["Eval Task,Task Category,Task Type,#shots,#datapoints,"
                                "Random baseline,Centered Metric?,Description"]
  for label, (src, uri, shots, kind, delim, baseline) in TASKS.items():
    target = tmp / "eval_data" / uri
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shared_dir / src, target)
    rows = sum(1 for line in target.read_text().splitlines() if line.strip())
    yaml += ["-", f"  label: {label}", f"  dataset_uri: {uri}", f"  num_fewshot: [{shots}]",
             f"  icl_task_type: {kind}"]
    if delim is not None:
      yaml.append(f'  continuation_delimiter: "{delim}"')
    meta.append(f"{label},offline,{kind.replace('_', ' ')},{shots},{rows},{baseline},,"
                f"from {src}")
  (tmp / "core.yaml").write_text("\n".join(yaml) + "\n")
  (tmp / "eval_meta_data.csv").write_text("\n".join(meta) + "\n")
  tmp.rename(dest)  # the bundle appears whole or not at all
  return dest


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}")
  if not FLAGS.dest:
    cli.fail("--dest is required (the bundle folder to write)")
  shared_dir = pathlib.Path(FLAGS.shared) if FLAGS.shared else shared.shared_data_dir()
  cli.run_main(lambda: print("CORE bundle (5 tasks): "
                             f"{write_bundle(shared_dir, pathlib.Path(FLAGS.dest).expanduser())}"))


if __name__ == "__main__":
  app.run(main)

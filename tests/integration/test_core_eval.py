"""CORE (laplax.evals.lm.core) on the offline bundle of the CPU studies: scripts/core_bundle.py, run
as a process on the shared data, writes a bundle read as the DCLM one (tasks, shots, baselines,
every row, the prompts), and a second run refuses to overwrite it in one error line.
In-process checks of the same module: tests/unit/test_core_eval.py."""



from laplax.evals.lm import core

from unit.test_core_eval import BOS, BYTES


# --- The offline bundle of the CPU studies (scripts/core_bundle.py) ---------------------------


def test_the_offline_bundle_is_read_as_the_dclm_one_and_refuses_to_overwrite(tmp_path,
                                                                           shared_data):
  import subprocess
  import sys
  from conftest import REPO
  dest = tmp_path / "bundle"
  run = lambda: subprocess.run([sys.executable, str(REPO / "scripts" / "core_bundle.py"),
                                f"--dest={dest}", f"--shared={shared_data}"],
                               capture_output=True, text=True, timeout=120)
  out = run()
  assert out.returncode == 0, out.stderr[-2000:]
  specs = {s.label: s for s in core.read_specs(dest)}
  assert {k: (s.kind, s.num_fewshot, s.random_baseline) for k, s in specs.items()} == {
      "arc_easy": ("multiple_choice", 10, 25.0), "arc_challenge": ("multiple_choice", 10, 25.0),
      "piqa": ("multiple_choice", 10, 50.0), "winogrande": ("schema", 0, 50.0),
      "lambada_openai": ("language_modeling", 0, 0.0)}
  assert specs["piqa"].continuation_delimiter == "\nAnswer: "
  for label, rows in (("arc_easy", 2376), ("piqa", 1838), ("lambada_openai", 5153)):
    assert len(core.load_task(dest, specs[label]).rows) == rows  # every row of the file
  # the prompts build: an ARC example's 10 shots, then its question with each of 4 choices
  ex = core.prepare(core.load_task(dest, specs["arc_easy"], max_per_task=11), BYTES)[0]
  assert len(ex.tokens) == 4 and ex.tokens[0][0] == BOS
  assert bytes(ex.tokens[0][1:].tolist()).decode().count("\nAnswer: ") == 11
  again = run()  # a second run never overwrites: one line, non-zero
  assert again.returncode != 0 and again.stderr.strip().splitlines() == [
      f"error: --dest={dest} exists: give a new folder"]

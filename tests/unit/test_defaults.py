"""Defaults in one place: every key of every evaluator is a config field, so the command line sets
it (`--config.evals.NAME.KEY=V`, parsed by config_flags as train.py does, config locked); the
shipped configs' sections hold every key; the loss keys live in one `loss` section."""

import json
import pathlib

from absl import flags
from ml_collections import config_flags
import ml_collections
import pytest

from configs import common
from conftest import make_config
from laplax import cli
from laplax.evals import offline
from laplax.train import evaluator as evaluator_lib
from laplax.train import restore
from laplax.train import shims
from laplax.train import task as task_lib
from unit.test_configs import CONFIGS, _load

REPO = pathlib.Path(__file__).resolve().parents[2]


def parse(config_file: str, *overrides: str) -> ml_collections.ConfigDict:
  """The config as train.py's flag parser builds it (config file, locked, then overrides)."""
  argv = ["train.py", f"--config={config_file}", *overrides]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                  sys_argv=argv)
  values(argv)
  return values.config


def _other(value):
  """(a value of the same type unlike `value`, its command-line spelling)."""
  if isinstance(value, bool):
    return (not value), str(not value)
  if isinstance(value, int):
    return value + 3, str(value + 3)
  if isinstance(value, float):
    return value * 2 + 0.5, repr(value * 2 + 0.5)
  if isinstance(value, str):
    return value + "_x", value + "_x"
  if isinstance(value, tuple):
    new = (tuple(v + "_x" if isinstance(v, str) else v + 1 for v in value) if value
           else ("x",))
    return new, repr(new)
  if isinstance(value, ml_collections.ConfigDict):
    return {"x": ""}, "{'x': ''}"
  if value is None:
    return 7, "7"
  raise AssertionError(f"no command-line spelling for {value!r}")


SECTION_CONFIG = '''
import ml_collections
from configs import common

def get_config(type_):
  c = ml_collections.ConfigDict()
  c.evals = ml_collections.ConfigDict({"e": common.evaluator(type_)})
  return c
'''


@pytest.mark.parametrize("type_", sorted(evaluator_lib.TYPES))
def test_every_key_of_every_evaluator_is_set_from_the_command_line(type_, tmp_path):
  """A section from common.evaluator holds COMMON + the class's defaults, each a field that
  --config.evals.NAME.KEY=V sets (new evaluator types are covered by this parametrisation)."""
  cls = evaluator_lib.get(type_)
  section = common.evaluator(type_)
  assert set(section) == set(evaluator_lib.COMMON) | set(cls.defaults)
  path = tmp_path / "sections.py"
  path.write_text(SECTION_CONFIG)
  wanted, overrides = {}, []
  for key, value in section.items():
    if key == "type":
      continue
    wanted[key], text = _other(value)
    overrides.append(f"--config.evals.e.{key}={text}")
  config = parse(f"{path}:{type_}", *overrides)
  got = config.evals.e.to_dict()
  for key, value in wanted.items():
    assert got[key] == value, (key, got[key], value)
  assert evaluator_lib.sections(config)["e"].to_dict() == got  # nothing left to fill in


@pytest.mark.parametrize("type_", sorted(evaluator_lib.TYPES))
def test_eval_py_sets_every_key_as_train_py_does(type_, tmp_path):
  """eval.py --set=NAME.KEY=V reads the same text as train.py's --config.evals.NAME.KEY=V into
  the same values, on a run's config as config.json holds it (tuples are JSON lists there)."""
  path = tmp_path / "sections.py"
  path.write_text(SECTION_CONFIG)
  section = common.evaluator(type_)
  texts = {key: _other(value)[1] for key, value in section.items() if key != "type"}
  trained = parse(f"{path}:{type_}", *(f"--config.evals.e.{k}={t}" for k, t in texts.items()))
  run = ml_collections.ConfigDict(json.loads(
      ml_collections.ConfigDict({"evals": {"e": section}}).to_json()))
  argv = [offline.parse_set(f"e.{k}={t}") for k, t in texts.items()]
  evaluated = offline.override(run, dict(argv))
  assert json.loads(evaluated.evals.e.to_json()) == json.loads(trained.evals.e.to_json())


def test_eval_py_set_selects_and_refuses_in_one_line():
  """--set changes keys before the selection (final / analysis / --evals decide what runs);
  '*.KEY' reaches every evaluator with KEY; a name, key or value that fits nothing is refused
  naming the --set."""
  run = make_config("lm")
  assert offline.select(run, offline.EvalOptions())[1] == ["val"]
  sets = dict(offline.parse_set(s) for s in ("lm_tasks.tasks=arc_easy,mmlu", "lm_tasks.limit=5",
                                              "lm_tasks.final=true", "*.examples=16",
                                              "val.final=false"))
  config, names = offline.select(run, offline.EvalOptions(analyze=True, overrides=sets))
  assert names == ["geometry", "lm_tasks", "mechanism"] and config.evals.lm_tasks.limit == 5
  assert config.evals.lm_tasks.tasks == ("arc_easy", "mmlu")
  assert config.evals.geometry.examples == config.evals.mechanism.examples == 16
  # a type the run lacks: --evals adds it, then --set reaches it
  vit = make_config("vit")
  config, names = offline.select(vit, offline.EvalOptions(
      evals=("mechanism", "attention"), overrides={"attention.compare": "runs/k0"}))
  assert names == ["mechanism", "attention"] and config.evals.attention.compare == "runs/k0"
  for text, message in [
      ("lm_tasks.limit=abc", "evals.lm_tasks.limit takes an integer (it is 0)"),
      ("lm_tasks.final=maybe", "evals.lm_tasks.final takes true or false (it is False)"),
      ("lm_tasks.limt=3", "evaluator 'lm_tasks' (lm_tasks) has no key 'limt'; its keys: "
                          "['analysis', 'at_init', 'batch_size', 'data_dir', 'every', 'final', "
                          "'limit', 'tasks']"),
      ("lm_tasks.type=bpb", "evaluator 'lm_tasks' (lm_tasks) has no key 'type'"),
      ("*.nokey=1", "no evaluator of this run has a key 'nokey'"),
      ("attention_maps.compare=x", "no evaluator 'attention_maps' in this run's config.evals "
                                   "(['core', 'geometry', 'lm_tasks', 'mechanism', 'val']); "
                                   "--evals=attention_maps adds one of that type")]:
    with pytest.raises(ValueError) as e:
      offline.select(run, offline.EvalOptions(overrides=dict([offline.parse_set(text)])))
    assert str(e.value).startswith(f"--set={text}: {message}"), str(e.value)
  with pytest.raises(ValueError, match=r"^evals.lm_tasks.limit=-1 must be an integer >= 0$"):
    offline.select(run, offline.EvalOptions(overrides={"lm_tasks.limit": "-1"}))
  for text in ("limit", "lm_tasks=5", "lm_tasks.data.x=1"):
    with pytest.raises(ValueError, match=f"^--set={text}: write NAME.KEY=VALUE"):
      offline.parse_set(text)
  assert cli.flag_error(ValueError("Unknown command line flag 'photos'"),
                        ["eval.py", "--photos="], {"photos": "--set=photos.photos=DIR"}) == \
      "--photos is gone: write --set=photos.photos=DIR"


def test_a_key_the_evaluator_does_not_have_is_refused_where_the_config_is_built():
  with pytest.raises(ValueError, match="evaluator 'accuracy' has no key 'splt'; its keys:"):
    common.evaluator("accuracy", splt="val")
  with pytest.raises(ValueError, match="evaluator type 'acuracy'; choose one of"):
    common.evaluator("acuracy")
  # A type that is gone says what replaced it, in one line.
  with pytest.raises(ValueError, match=r"evaluator type 'ade20k_patch' is gone: use 'ade20k'"):
    common.evaluator("ade20k_patch", dir="ADEChallengeData2016")


@pytest.mark.parametrize("config_file, override, key", [
    ("fashion_mnist_vit.py", "--config.evals.val.at_init=True", ("val", "at_init", True)),
    ("dino_tiny.py", "--config.evals.probes.final=False", ("probes", "final", False)),
    ("lm_tiny.py", "--config.evals.lm_tasks.limit=5", ("lm_tasks", "limit", 5)),
    ("test.py:dino", "--config.evals.probes.knn_ks=(5, 7)", ("probes", "knn_ks", (5, 7))),
])
def test_the_issues_examples_switch_an_evaluator_from_the_command_line(config_file, override,
                                                                       key):
  name, field, value = key
  config = parse(str(REPO / "configs" / config_file), override)
  assert config.evals[name][field] == value


def test_old_config_json_sections_still_take_the_defaults():
  """A config.json of an older run holds only the keys its config stated."""
  old = ml_collections.ConfigDict({"evals": {"probes": {"type": "dino_probes", "at_init": True}}})
  full = evaluator_lib.sections(old)["probes"]
  assert full.at_init and full.final and full.probe_epochs == 30


def _runs(config):
  """The run configs of a shipped config: itself, or a study's base and its stages."""
  if "study" not in config:
    return [config]
  return [config.base, *config.study.get("stages", {}).values()]


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_evaluator_section_holds_every_key(name):
  for run in _runs(_load(name)):
    for section_name, section in run.get("evals", {}).items():
      known = {**evaluator_lib.COMMON, **evaluator_lib.get(section.type).defaults}
      assert set(section) == set(known), (section_name, sorted(set(known) - set(section)))


@pytest.mark.parametrize("old, value, new", [
    ("loss", "sigmoid_xent", "loss.name"),
    ("bce_binary_targets", True, "loss.bce_binary_targets"),
    ("optim.label_smoothing", 0.1, "loss.label_smoothing"),
    ("mixup", {"mixup_alpha": 0.8}, "loss.mixup"),
])
def test_the_loss_keys_of_four_sections_are_one_loss_section(old, value, new):
  """An old key in a config is refused naming the new one; an older run's config.json is read
  with it moved (restore.read_config); train.py's flag error names the new flag."""
  config = _load("test:vit")
  if old == "loss":
    del config["loss"]
  config.update_from_flattened_dict({old: value}) if "." in old else config.__setitem__(old, value)
  with pytest.raises(ValueError, match=f"config.{old} is gone: write config.{new}"):
    task_lib.for_config(config)
  moved = shims.move_keys(config)
  assert shims.moved_keys(moved) == []
  got = moved
  for part in new.split("."):
    got = got[part]
  assert (got.to_dict() if hasattr(got, "to_dict") else got) == value
  flag = f"--config.{old}.mixup_alpha=0.8" if old == "mixup" else f"--config.{old}={value}"
  line = cli._moved_flag(["train.py", "--config=configs/test.py:vit", flag])
  assert line.startswith(f"--config.{old}") and f"write --config.{new}" in line


def test_an_old_lm_run_reads_back_with_its_loss_chunk_moved(tmp_path):
  config = _load("test:lm").to_dict()
  del config["loss"]
  config["model"]["loss_chunk"] = 8  # where laplax kept it before the loss section
  (tmp_path / "config.json").write_text(json.dumps(config, default=list))
  read = restore.read_config(tmp_path)
  assert read.loss.chunk == 8 and "loss_chunk" not in read.model
  task_lib.for_config(read).build_model()  # the model section builds the GPT again


def test_an_evaluator_on_a_task_without_its_data_interface_is_one_line():
  """Evaluator.reads: an image evaluator in a language model's config is refused before
  anything is written, naming the interface it needs; the classification task gives it."""
  c = make_config("lm")
  c.evals.acc = evaluator_lib.section("accuracy", split="val")
  with pytest.raises(ValueError, match=r"^evals.acc: accuracy reads EvalImages \(info, "
                                       r"eval_splits, eval_size, eval_batches, eval_params\), "
                                       r"which a 'lm' task does not give$"):
    evaluator_lib.check(c, task_lib.for_config(c))
  vit = make_config("vit")
  assert isinstance(task_lib.for_config(vit), task_lib.EvalImages)
  evaluator_lib.check(vit, task_lib.for_config(vit))
  vit.evals.bpb = evaluator_lib.section("lm_geometry")
  with pytest.raises(ValueError, match=r"^evals.bpb: lm_geometry reads EvalTokens \(tokenizer, "
                                       r"val_batches, val_windows\), which a 'classification' "):
    evaluator_lib.check(vit, task_lib.for_config(vit))
  lm = task_lib.for_config(make_config("lm"))
  assert isinstance(lm, task_lib.EvalTokens) and not isinstance(lm, task_lib.EvalImages)
  # A DINO evaluator in a ViT config (was a traceback: "ViT" object has no attribute
  # "backbone"): every image task gives EvalSources, so what refuses it is the weights, which
  # keep no teacher.
  for type_ in ("dino_probes", "dino_spectra", "photo_pca"):
    vit = make_config("vit")
    vit.evals.p = evaluator_lib.section(type_)
    assert isinstance(task_lib.for_config(vit), task_lib.EvalSources)
    with pytest.raises(ValueError, match=rf"^evals.p: {type_} measures the frozen teacher "
                                         r"\(state.extra\['teacher'\]\), which a "
                                         r"'classification' run does not keep$"):
      evaluator_lib.check(vit, task_lib.for_config(vit))
  dino = task_lib.for_config(make_config("dino"))
  assert isinstance(dino, task_lib.EvalSources) and not isinstance(dino, task_lib.EvalImages)
  assert task_lib.state_keys(dino) == {"teacher", "centre"}
  assert task_lib.state_keys(task_lib.for_config(make_config("vit"))) == set()
  # Every task is a Subject of the analysis (mechanism, attention maps), by its own kind.
  kinds = {name: task_lib.for_config(make_config(name)).analysis_kind
           for name in ("vit", "dino", "lm")}
  assert kinds == {"vit": "vit", "dino": "vit", "lm": "gpt"}
  assert all(isinstance(task_lib.for_config(make_config(n)), task_lib.Subject) for n in kinds)
  vit = make_config("vit")
  vit.evals.chat = evaluator_lib.section("chat", tasks=("arc_easy",))
  with pytest.raises(ValueError, match=r"^evals.chat: chat reads EvalChat \(tokenizer, val_batches, "
                                        r"val_windows, words\), which a 'classification' "):
    evaluator_lib.check(vit, task_lib.for_config(vit))
  assert isinstance(task_lib.for_config(make_config("lm")), task_lib.EvalChat)


def _every_key_set(tmp_path, config_text: str, arg: str, table, skip=()) -> None:
  """The data section of config_text's get_config(arg), built as train.py does, holds exactly
  `table`'s keys, and --config.data.KEY=V sets each (but `skip`) to another value."""
  path = tmp_path / "data_sections.py"
  path.write_text(config_text)
  built = parse(f"{path}:{arg}").data
  assert set(built) == set(table)
  wanted, overrides = {}, []
  for key, value in built.items():
    if key not in skip:
      wanted[key], text = _other(value)
      overrides.append(f"--config.data.{key}={text}")
  got = parse(f"{path}:{arg}", *overrides).data.to_dict()
  for key, value in wanted.items():
    assert got[key] == value, (key, got[key], value)


DATA_CONFIG = '''
import ml_collections
from configs import common

def get_config(which):
  task, streamed = which.split(",")
  build = common.streamed_image_data if streamed == "1" else common.image_data
  return ml_collections.ConfigDict({"data": build("cifar10", task=task)})
'''


@pytest.mark.parametrize("task, streamed", [(t, s) for t in ("classification", "dino")
                                            for s in (False, True)])
def test_every_key_of_an_image_data_section_is_set_from_the_command_line(task, streamed,
                                                                         tmp_path):
  """configs/common.py's image data sections hold every key of laplax.sections' table, each
  a field that --config.data.KEY=V sets; the task completes a section written without them (an
  older config.json) to the same keys, and refuses a key its table lacks in one line."""
  from laplax import sections
  table = sections.TABLES[task, streamed]
  # tfds_name: what makes the section streamed
  _every_key_set(tmp_path, DATA_CONFIG, f"{task},{int(streamed)}", table, skip=("tfds_name",))

  config = make_config("dino" if task == "dino" else "vit")
  config.data = ml_collections.ConfigDict(
      {"name": "cifar10", "batch_size": 32, **({"tfds_name": "cifar10"} if streamed else {})})
  task_lib.for_config(config)
  assert set(config.data) == set(table)
  assert config.data.eval_batch_size == table["eval_batch_size"] and config.data.batch_size == 32
  config.data.crop_scale = (0.2, 1.0)  # a key of an older laplax
  with pytest.raises(ValueError, match="^data has no key 'crop_scale'; its keys: ") as e:
    task_lib.for_config(config)
  assert "\n" not in str(e.value)


OPTIM_CONFIG = '''
import ml_collections
from configs import common

def get_config(which):
  return ml_collections.ConfigDict(
      {"optim": common.adamw(1e-3, warmup_steps=5) if which == "adamw" else common.lm_optim()})
'''


def _flat(section, prefix=""):
  """{dotted key: value} of a nested section."""
  out = {}
  for key, value in section.items():
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


@pytest.mark.parametrize("which", ["adamw", "lm"])
def test_every_key_of_the_optim_section_is_set_from_the_command_line(which, tmp_path):
  """configs/common.py's optim sections (the image tasks' adamw, the LM's) hold every key of
  laplax.sections.OPTIM (optim.muon's too), each a field --config.optim.KEY=V sets (None
  defaults included); the trainer's optimiser reads the completed section, and a section
  written without them (an older config.json) is completed; a key OPTIM lacks is one line."""
  from laplax import sections
  from laplax.train import optim as optim_lib
  path = tmp_path / "optim_sections.py"
  path.write_text(OPTIM_CONFIG)
  built = _flat(parse(f"{path}:{which}").optim)
  assert set(built) == set(_flat(sections.OPTIM))
  wanted, overrides = {}, []
  for key, value in built.items():
    wanted[key], text = _other(value)
    overrides.append(f"--config.optim.{key}={text}")
  got = _flat(parse(f"{path}:{which}", *overrides).optim.to_dict())
  assert got == wanted

  config = make_config("vit")
  config.optim = ml_collections.ConfigDict({"lr": 0.01, "warmup_steps": 2})
  task_lib.for_config(config)
  assert _flat(config.optim) == {**_flat(sections.OPTIM), "lr": 0.01, "warmup_steps": 2}
  optim_lib.make(ml_collections.ConfigDict({"lr": 0.01}), 10)  # completed where it is read
  config.optim.eps = 1e-8  # not a key of any optimiser
  for build in (lambda: task_lib.for_config(config), lambda: optim_lib.check(config.optim)):
    with pytest.raises(ValueError, match="^optim has no key 'eps'; its keys: b1, b2, ") as e:
      build()
    assert "\n" not in str(e.value)


TEXT_CONFIG = '''
import ml_collections
from configs import common

def get_config(which):
  if which == "lm":
    return ml_collections.ConfigDict({"data": common.text_data(sources=("a.txt",))})
  return ml_collections.ConfigDict({"data": common.chat_data(
      rows="padded", train={"s": {"kind": "smoltalk"}}, val={}, seq_len=64, batch_size=4,
      eval_batch_size=4, vocab_size=512)})
'''


@pytest.mark.parametrize("task", ["lm", "chat"])
def test_every_key_of_a_text_data_section_is_set_from_the_command_line(task, tmp_path):
  """The lm and chat data sections hold every key of their laplax.sections table, each a field
  --config.data.KEY=V sets; the task completes a section written without them, keeps the free
  mixture sections (chat's train / val) as given, and refuses a key its table lacks."""
  from laplax import sections
  table = sections.TABLES[task, False]
  _every_key_set(tmp_path, TEXT_CONFIG, task, table)

  config = make_config("lm")
  config.task = task
  config.data = ml_collections.ConfigDict(
      {"seq_len": 32, **({"train": {"mine": {"kind": "smoltalk"}}} if task == "chat" else {})})
  task_lib.for_config(config)
  assert set(config.data) == set(table) and config.data.seq_len == 32
  if task == "chat":
    assert config.data.train.to_dict() == {"mine": {"kind": "smoltalk"}}
    assert config.data.val.to_dict() == {}
  config.data.suffix = ".md"
  with pytest.raises(ValueError, match="^data has no key 'suffix'; its keys: ") as e:
    task_lib.for_config(config)
  assert "\n" not in str(e.value)

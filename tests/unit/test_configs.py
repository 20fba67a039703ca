"""Every shipped config loads, names a registered task, passes its task's checks, and takes a
per-layer head list from the command line."""

import importlib
import pathlib

from absl import flags
from ml_collections import config_flags
import pytest

from configs import common
from laplax import cli
from laplax import heads as heads_lib
from laplax.data import builders
from laplax.study import fit
from laplax.study import sweep
from laplax.train import evaluator as evaluator_lib
from laplax.train import task as task_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = sorted(p.stem for p in (REPO / "configs").glob("*.py")
                 if p.stem not in ("__init__", "common", "test"))
CONFIGS += sorted(f"pod.{p.stem}" for p in (REPO / "configs" / "pod").glob("*.py")
                  if p.stem != "__init__")  # pod configs: validated without local data
CONFIGS += sorted(f"gpu.{p.stem}" for p in (REPO / "configs" / "gpu").glob("*.py")
                  if p.stem != "__init__")  # GPU-node configs: the pod configs on 8 GPUs
CONFIGS += ["study_dino:fashion_mnist"]  # file:argument, as --config=configs/FILE.py:ARG
CONFIGS += ["pod.vit_b16_imagenet:deit3", "pod.vit_b16_imagenet_ft224:deit3"]  # named recipes
CONFIGS += [f"test:{k}" for k in ("vit", "vit_deit3", "lm", "dino", "dino_rgb", "study_vit",
                                  "study_lm", "study_dino", "chat_mid", "chat_sft",
                                  "study_chat", "sweep")]


def _load(name):
  name, *arg = name.split(":")
  config = importlib.import_module(f"configs.{name}").get_config(*arg)
  if name.startswith("gpu."):  # cuDNN's attention traces only where JAX finds cuDNN
    assert config.model.attention_impl == "cudnn"
    config.model.attention_impl = "xla"
  return config


def _parse(name, *args):
  """The config as train.py's flag parser builds it (config file + --config.x overrides)."""
  file, *arg = name.split(":")
  path = REPO / "configs" / file.replace(".", "/")
  gpu = ["--config.model.attention_impl=xla"] if file.startswith("gpu.") else []  # see _load
  argv = ["train.py", f"--config={path}.py" + (f":{arg[0]}" if arg else ""),
          *gpu, *args]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                  sys_argv=argv)  # config_flags reads overrides from argv
  values(argv)
  return values.config


@pytest.mark.parametrize("name", CONFIGS)
def test_config_is_valid(name):
  config = _load(name)
  assert "study" in config or config.task in task_lib.TASKS
  run = config.base if "study" in config else config  # a study's cells are runs of base
  task = task_lib.for_config(run)
  task.validate(dp=1, hosts=1)
  evaluator_lib.check(run, task)
  assert {"name", "schedule"} <= set(run.optim), "state optim.name and optim.schedule"
  for section in evaluator_lib.sections(run).values():
    for data_set in section.get("data", {}) if section.type == "dino_transfer" else ():
      builders.dataset_info(data_set)


STUDIES = ("study", "test:st", "test:sweep", "pod.study")


@pytest.mark.parametrize("name", [n for n in CONFIGS if not n.startswith(STUDIES)])
def test_per_layer_head_list_from_the_command_line(name):
  task = task_lib.for_config(_load(name))
  model = task.build_model()
  heads, depth = model.num_heads, model.depth
  spec = "(" + ",".join(str(i % (heads + 1)) for i in range(depth)) + ")"
  config = _parse(name, f"--config.model.laplacian_heads={spec}")
  task = task_lib.for_config(config)
  assert heads_lib.model_heads(task.build_model()) == "k=[" + spec[1:-1] + "]" or depth == 1
  task.validate(dp=1, hosts=1)


@pytest.mark.parametrize("name", [n for n in CONFIGS if n.startswith("pod.")])
def test_pod_config_flags(name):
  """Pod configs validate at their data-parallel scale, name their target topology and take
  the fit-check overrides from the command line."""
  config = _load(name)
  assert "Target: TPU " in importlib.import_module(f"configs.{name.split(':')[0]}").__doc__
  study = "study" in config  # a pod study: its cells are runs of config.base
  run, prefix = (config.base, "--config.base.") if study else (config, "--config.")
  task_lib.for_config(run).validate(dp=16, hosts=4)
  seq = [f"{prefix}data.seq_len=8192"] if run.task == "lm" else []
  config = _parse(name, f"{prefix}data.batch_size=16", f"{prefix}model.attention_impl=xla",
                  f"{prefix}model.remat_policy=dots_saveable", *seq)
  run = config.base if study else config
  assert (run.data.batch_size, run.model.attention_impl, run.model.remat_policy) == (
      16, "xla", "dots_saveable")
  task_lib.for_config(run).validate(dp=16, hosts=4)


@pytest.mark.parametrize("name, override, message", [
    ("test:dino", {"evals.probes.knn_ks": (0, 20)},
     "evals.probes.knn_ks=\\(0, 20\\) must be a tuple of numbers each an integer >= 1"),
    ("test:dino", {"evals.probes.probe_lr": 0.0},
     "evals.probes.probe_lr=0.0 must be a finite positive number"),
    ("test:lm", {"evals.lm_tasks.limit": -1}, "evals.lm_tasks.limit=-1 must be an integer >= 0"),
    ("test:dino", {"optim.clip_mode": "layer"}, "optim.clip_mode='layer': use one of"),
    ("test:dino", {"optim.weight_decay_end": -0.4}, "optim.weight_decay_end=-0.4 must be a finite"),
    ("test:dino_rgb", {"evals.photos.size": 30},
     "evals.photos: size=30 is not divisible by model.patch_size=8"),
    ("test:dino", {"total_steps": -5}, "total_steps=-5 must be an integer >= 0"),
    ("test:vit", {"evals.test.split": "dev"}, "evals.test: split='dev'; this run evaluates on"),
    ("test:vit", {"optim.b1": 1.5}, "optim.b1=1.5 must be in \\[0, 1\\)"),
    ("test:vit", {"optim.b2": float("nan")}, "optim.b2=nan must be in \\[0, 1\\)"),
    ("test:vit", {"loss.label_smoothing": 1.5}, "loss.label_smoothing=1.5 must be in \\[0, 1\\]"),
    ("test:vit", {"loss.mixup.prob": -0.5}, "loss.mixup.prob=-0.5 must be in \\[0, 1\\]"),
    ("test:dino", {"multicrop.flip_prob": 1.5}, "multicrop.flip_prob=1.5 must be in \\[0, 1\\]"),
    ("test:dino", {"multicrop.global_scale": (0.0, 1.0)},
     "multicrop.global_scale=\\(0.0, 1.0\\) must be a tuple of numbers each in \\(0, 1\\]"),
    ("test:vit", {"model.drop_path_rate": 1.5}, "model.drop_path_rate=1.5 must be in \\[0, 1\\)"),
    ("test:vit", {"seed": -1}, "seed=-1 must be an integer >= 0"),
    ("test:lm", {"data.seq_len": 1}, "data.seq_len=1 must be an integer >= 2"),
    ("test:dino", {"dino.momentum_teacher": 1.5},
     "dino.momentum_teacher=1.5 must be in \\[0, 1\\]"),
    ("test:lm", {"evals.lm_tasks.tasks": ("nope",)}, "evals.lm_tasks: unknown task 'nope'"),
    ("test:dino", {"optim.name": "sgd"}, "optim.name='sgd': use one of \\('adamw', 'muon', 'nanochat'\\)"),
    ("test:dino", {"optim.schedule": "step"},
     "optim.schedule='step': use one of \\('cosine', 'warmdown', 'timm_cosine'\\)"),
])
def test_config_errors_before_training(name, override, message):
  config = _load(name)
  config.update_from_flattened_dict(override)
  task = task_lib.for_config(config)
  with pytest.raises(ValueError, match=message):
    task.validate(dp=1, hosts=1)
    evaluator_lib.check(config, task)


def test_keys_of_older_configs_say_how_they_are_written_now():
  config = _load("test:vit")
  config.eval_every = 10
  with pytest.raises(ValueError, match="config.eval_every is gone: an evaluator's `every`"):
    task_lib.for_config(config).validate(dp=1, hosts=1)


@pytest.mark.parametrize("kind, message", [
    ("dino", "optim.name='muon' cannot freeze the last layer"),
    ("vit", "optim.name='muon' scales its AdamW lrs by the model width: pass width"),
])
def test_an_optimiser_the_task_cannot_serve_fails_before_training(kind, message):
  config = _load(f"test:{kind}")
  config.optim.name = "muon"
  config.optim.muon = common.muon()
  with pytest.raises(ValueError, match=message):
    task_lib.for_config(config).validate(dp=1, hosts=1)


def test_config_file_errors_fold_to_their_last_line():
  # config_flags wraps an error raised in get_config with the config file's traceback.
  wrapped = ValueError(
      "flag --config=configs/study_dino.py:mnist: Error whilst parsing config file: Traceback "
      "(most recent call last):\n  File \"x.py\", line 3, in get_config\n    raise ValueError(\n"
      "ValueError: configs/study_dino.py:mnist: use one of ['cifar10', 'fashion_mnist']\n")
  assert cli.one_line(wrapped) == (
      "flag --config=configs/study_dino.py:mnist: Error whilst parsing config file: ValueError: "
      "configs/study_dino.py:mnist: use one of ['cifar10', 'fashion_mnist']")
  assert cli.one_line(ValueError("plain\nmessage")) == "plain message"


def test_an_override_of_a_missing_field_names_the_flag():
  # config_flags raises a bare AttributeError("'depth'"): the line must say which flag.
  argv = ["train.py", "--config=configs/pod/vit_b_cifar100.py", "--config.model.depth=2"]
  assert cli._missing_field(AttributeError("'depth'"), argv) == (
      "--config.model.depth: the config has no field 'depth'")
  assert cli._missing_field(AttributeError("'width'"), argv) is None
  assert cli._missing_field(ValueError("depth"), argv) is None


def test_shared_data_dir_is_the_env_or_next_to_the_repository(tmp_path, monkeypatch):
  from laplax.data import shared
  monkeypatch.setenv("LAPLAX_SHARED_DATA", str(tmp_path / "mine"))
  assert shared.shared_data_dir() == tmp_path / "mine"
  monkeypatch.delenv("LAPLAX_SHARED_DATA")
  assert shared.shared_data_dir() == REPO.parent / "shared" / "data"


def test_unknown_task_is_one_line():
  config = _load("test:vit")
  config.task = "segmentation"
  with pytest.raises(ValueError, match="config.task='segmentation'; choose one of"):
    task_lib.for_config(config)


def test_pod_configs_are_built_from_the_shared_sections():
  """A pod config imports configs/common.py's sections, never a CPU config (a change to a CPU
  config must not move a pod run); a pod study imports the pod config it studies."""
  for path in sorted((REPO / "configs" / "pod").glob("*.py")):
    imports = [l for l in path.read_text().splitlines()
               if l.startswith(("from configs", "import configs"))]
    allowed = ["from configs import common"]
    if path.name.startswith("study_"):
      allowed += [l for l in imports if l.startswith("from configs.pod import ")]
    assert set(imports) <= set(allowed), (path.name, imports)
  for path in sorted((REPO / "configs" / "gpu").glob("*.py")):  # a pod config on a GPU node
    imports = [l for l in path.read_text().splitlines()
               if l.startswith(("from configs", "import configs"))]
    assert set(imports) <= {"from configs import common", f"from configs.pod import {path.stem}"
                            }, (path.name, imports)


def test_a_study_grid_from_the_command_line():
  config = _parse("study_fmnist", "--config.study.laplacian_heads=(0, 2, (0, 0, 4, 4))",
                  "--config.study.seeds=(5, 6)")
  assert list(config.study.laplacian_heads) == [0, 2, (0, 0, 4, 4)]
  assert tuple(config.study.seeds) == (5, 6)


@pytest.mark.parametrize("name", [n for n in CONFIGS if n.startswith("pod.study")])
def test_every_program_of_a_pod_study_validates_at_its_scale(name):
  """Each head spec's cell (and each stage of the chat pipeline; of each depth of a sweep) as
  `train.py --aot` compiles it (laplax.study.fit.programs) validates on 16 data-parallel chips
  of 4 hosts."""
  config = _load(name)
  studies = ([sweep.depth_config(config, d) for d in config.study.depths]
             if sweep.is_sweep(config) else [config])
  for study in studies:
    programs = fit.programs(study)
    specs = len(study.study.laplacian_heads)
    stages = 1 + len(study.study.stage_order) if study.study.get("section") else 1
    assert len(programs) == specs * stages, list(programs)
    for cfg in programs.values():
      task_lib.for_config(cfg).validate(dp=16, hosts=4)

"""config.wandb without a W&B run: the section's defaults and refusals, the credentials check,
the run id kept in the workdir, the rows a sink gets from the metrics writer. Offline runs
read back with wandb's own reader: tests/integration/test_wandb.py."""

import json
import re

import ml_collections
import pytest

from conftest import make_config
from laplax.train import trainer
from laplax.train import wandb_sink
from laplax.train.metrics import MetricsWriter


def test_the_section_defaults_to_disabled_and_refuses_bad_keys():
  assert wandb_sink.check(ml_collections.ConfigDict({"name": "x"})) is None  # an old config
  config = make_config("vit")
  assert config.wandb.mode == "disabled" and wandb_sink.check(config) is None
  config.wandb.mode = "offlne"
  with pytest.raises(ValueError, match=r"wandb.mode='offlne': use one of \('disabled'"):
    wandb_sink.check(config)
  with pytest.raises(ValueError, match="wandb has no key 'projct'"):
    wandb_sink.check(ml_collections.ConfigDict({"wandb": {"projct": "p"}}))
  config.wandb.mode = "offline"
  assert wandb_sink.check(config, environ={}).project == "laplax"


def test_online_needs_credentials(tmp_path):
  config = make_config("vit")
  config.wandb.mode = "online"
  netrc = tmp_path / "netrc"
  netrc.write_text("machine example.com login user password secret\n")
  env = {"NETRC": str(netrc)}
  with pytest.raises(ValueError, match="no W&B credentials were found"):
    wandb_sink.check(config, environ=env)
  assert wandb_sink.check(config, environ={**env, "WANDB_API_KEY": "k" * 40}) is not None
  netrc.write_text("machine api.wandb.ai login user password secret\n")
  assert wandb_sink.check(config, environ=env) is not None  # `wandb login`'s entry
  # Another server's entry counts for that server only.
  assert not wandb_sink.has_credentials({**env, "WANDB_BASE_URL": "https://wandb.example.org"})


def test_online_without_credentials_writes_nothing(tmp_path, data_cache, monkeypatch):
  for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
  config = make_config("vit", data_cache)
  config.wandb.mode = "online"
  with pytest.raises(ValueError, match="no W&B credentials"):
    trainer.train_and_evaluate(config, tmp_path / "w", log=lambda m: None)
  assert not (tmp_path / "w").exists()


def test_the_run_id_is_made_once_and_kept(tmp_path):
  made = iter(["abc12345", "other999"])
  assert wandb_sink.run_id(tmp_path, lambda: next(made)) == "abc12345"
  assert wandb_sink.run_id(tmp_path, lambda: next(made)) == "abc12345"
  assert json.loads((tmp_path / wandb_sink.ID_FILE).read_text()) == {"id": "abc12345"}
  assert re.fullmatch("[a-z0-9]{8}", wandb_sink.new_id())


class _FakeRun:
  def __init__(self):
    self.logged, self.finished = [], False

  def log(self, values, step):
    self.logged.append((step, values))

  def finish(self):
    self.finished = True


def test_the_writer_sends_each_row_s_numbers_to_its_sinks(tmp_path):
  run = _FakeRun()
  writer = MetricsWriter(tmp_path, tensorboard=False, sinks=[wandb_sink.WandbSink(run)])
  writer.write(3, "train", {"loss": 0.5, "steps": 2, "skip": True, "note": "x", "hist": [1, 2]})
  writer.write(3, "val", {"accuracy": 0.25})
  writer.close()
  assert run.logged == [(3, {"train/loss": 0.5, "train/steps": 2}), (3, {"val/accuracy": 0.25})]
  assert run.finished
  # Not process 0: no sink is fed.
  run = _FakeRun()
  MetricsWriter(tmp_path, active=False, sinks=[wandb_sink.WandbSink(run)]).write(
      4, "train", {"loss": 1.0})
  assert run.logged == []

"""Weights & Biases beside TensorBoard: config.wandb (laplax.sections.WANDB) -> a sink of the
metrics writer, which sends it every row it writes (laplax.train.metrics.MetricsWriter).

mode 'disabled' (the default) never imports wandb; 'offline' writes W&B's own run files
(`wandb sync` uploads them later); 'online' logs to the server. The run's W&B id is kept in
workdir/wandb_run.json (ID_FILE, written before wandb.init), and every attempt of the run
passes it with resume='allow': a resumed run continues the same W&B run. Only process 0
logs (the writer is active there alone).

Online mode without credentials (no WANDB_API_KEY, no WANDB_IDENTITY_TOKEN_FILE, no netrc
entry for the W&B host) is refused before anything is written (`check`): a user who asked
for online logging and got none would find out only after the run; the fix (wandb login,
the key, or mode='offline') takes seconds, before a run that may take days.
"""

from __future__ import annotations

from collections.abc import Mapping
import netrc
import os
import pathlib
import secrets
import string
from typing import Any
from urllib.parse import urlsplit

import ml_collections

from laplax import sections
from laplax.train import workdir as workdir_lib

MODES = ("disabled", "offline", "online")
ID_FILE = "wandb_run.json"
DEFAULT_HOST = "https://api.wandb.ai"


def settings(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """config.wandb completed with laplax.sections.WANDB's defaults (a config without the
  section: disabled); an unknown key or mode is one ValueError line."""
  section = sections.completed(config.get("wandb") or {}, sections.WANDB, "wandb")
  if section.mode not in MODES:
    raise ValueError(f"wandb.mode={section.mode!r}: use one of {MODES}")
  if isinstance(section.tags, str):
    raise ValueError(f"wandb.tags={section.tags!r}: use a tuple of strings, e.g. "
                     "\"('vit','k4')\"")
  return section


def has_credentials(environ: Mapping[str, str] = os.environ) -> bool:
  """Whether wandb would find credentials for its host without asking: WANDB_API_KEY,
  WANDB_IDENTITY_TOKEN_FILE, or a netrc entry (NETRC, else ~/.netrc) for WANDB_BASE_URL's host
  (api.wandb.ai by default)."""
  if environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE"):
    return True
  host = urlsplit(environ.get("WANDB_BASE_URL") or DEFAULT_HOST).hostname or ""
  path = pathlib.Path(environ.get("NETRC") or pathlib.Path.home() / ".netrc").expanduser()
  try:
    entry = netrc.netrc(str(path)).authenticators(host)
  except (OSError, netrc.NetrcParseError):
    return False
  return bool(entry and entry[2])


def check(config: ml_collections.ConfigDict, environ: Mapping[str, str] = os.environ
          ) -> ml_collections.ConfigDict | None:
  """The wandb section when logging is on, None when disabled; online mode without
  credentials is one ValueError line (called before anything is written)."""
  section = settings(config)
  if section.mode == "disabled":
    return None
  if section.mode == "online" and not has_credentials(environ):
    raise ValueError("wandb.mode='online' but no W&B credentials were found (WANDB_API_KEY, "
                     "or `wandb login`'s ~/.netrc entry); log in, or use "
                     "--config.wandb.mode=offline (then `wandb sync`), or 'disabled' to log nothing")
  return section


def run_id(workdir, make) -> str:
  """The run's W&B id: the one in workdir/ID_FILE, else make() (stored first, atomically)."""
  path = workdir_lib.as_path(workdir) / ID_FILE
  if path.exists():
    return str(workdir_lib.read_json(path, "W&B run id")["id"])
  new = str(make())
  workdir_lib.write_json_atomic(path, {"id": new})
  return new


def new_id() -> str:
  """A fresh W&B run id: 8 characters of [a-z0-9], as wandb makes them."""
  return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbSink:
  """Logs each metrics row's numbers as `split/key` at the row's step (the keys and numbers
  TensorBoard gets; rows of one step merge into one W&B history row)."""

  def __init__(self, run):
    self.run = run

  @classmethod
  def open(cls, section: ml_collections.ConfigDict, workdir, config: dict[str, Any],
           name: str) -> WandbSink:
    """wandb.init of the run in `workdir` (its id reused), with the resolved `config`."""
    import wandb  # only here: laplax runs without wandb installed unless it is enabled

    workdir = workdir_lib.as_path(workdir)
    directory = section.dir or (str(workdir) if workdir_lib.is_local(workdir) else None)
    if directory:
      pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
    try:
      run = wandb.init(
          project=section.project, entity=section.entity or None, name=section.name or name,
          tags=list(section.tags) or None, dir=directory, mode=section.mode,
          id=run_id(workdir, new_id), resume="allow", config=config,
          # stdout stays the trainer's (progress lines, one-line errors); W&B's own lines
          # without the history sparklines at the end
          settings=wandb.Settings(console="off", quiet=True))
    except Exception as e:  # wandb's errors (network, server) as laplax's one line
      raise ValueError(f"wandb.init ({section.mode}) failed: "
                       f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
                       ) from None
    return cls(run)

  def write(self, step: int, split: str, record: Mapping[str, Any]) -> None:
    values = {f"{split}/{k}": v for k, v in record.items()
              if k not in ("step", "split", "time") and isinstance(v, (int, float))
              and not isinstance(v, bool)}
    if values:
      self.run.log(values, step=int(step))

  def close(self) -> None:
    self.run.finish()

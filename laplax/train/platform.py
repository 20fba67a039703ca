"""Which backend a run is on, and whether its config may run there (train.py and eval.py).

`describe()` is the one start-up line: backend, device kind, local and global device counts.

A config that targets accelerators says so: `config.platform = 'tpu'` (every configs/pod/
config) or 'gpu'; None (configs/common.run's default) runs anywhere. `check` refuses such a
config on another backend with one line naming the install command (a TPU VM whose venv has
CPU jax would otherwise train a pod config on its CPU, silently and very slowly), and refuses
splash attention (`model.attention_impl='splash'`, a Pallas TPU kernel) off TPU, where it
could only run in Pallas interpret mode: that mode is for tests (which call the kernel
directly) and for a run started with the explicit override (`--allow_platform_mismatch`),
which then says so in a line. 'auto' never picks splash off TPU (laplax.attention).
`train.py --aot` compiles pod configs on a CPU host by design and is not checked.
"""

from __future__ import annotations

import jax
import ml_collections

PLATFORMS = ("cpu", "gpu", "tpu")
INSTALL = {"tpu": "bash scripts/setup.sh --tpu", "gpu": "bash scripts/setup.sh --cuda",
           "cpu": "bash scripts/setup.sh"}
OVERRIDE = "--allow_platform_mismatch"


def describe() -> str:
  """'backend tpu (TPU v5 lite): 4 local / 32 global devices, process 0 of 8'."""
  try:
    kind = jax.local_devices()[0].device_kind
  except RuntimeError as e:  # e.g. JAX_PLATFORMS=tpu where jax has no TPU build or finds none
    raise ValueError(f"JAX cannot start its backend ({str(e).splitlines()[0][:200]}): on a TPU "
                     f"VM install the TPU build with `{INSTALL['tpu']}`, on a GPU host "
                     f"`{INSTALL['gpu']}`") from None
  return (f"backend {jax.default_backend()} ({kind}): {jax.local_device_count()} local / "
          f"{jax.device_count()} global devices, process {jax.process_index()} of "
          f"{jax.process_count()}")


def _run_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config of one run: a study's `base` (its cells run that)."""
  return config.base if "study" in config and "base" in config else config


def check(config: ml_collections.ConfigDict, *, allow_mismatch: bool = False,
          backend: str | None = None) -> list[str]:
  """Raises ValueError (one line) when `config` must not run on `backend` (default: JAX's);
  -> the notes to log when `allow_mismatch` lets it run anyway."""
  run = _run_config(config)
  backend = backend or jax.default_backend()
  target = run.get("platform") or None
  if target == "None":  # --config.platform=None on the command line is that string
    target = None
  if target is not None and target not in PLATFORMS:
    raise ValueError(f"config.platform={target!r}: use one of {PLATFORMS}, or None (any)")
  problems = []
  if target is not None and target != backend:
    problems.append(f"config.platform={target!r} but JAX runs on {backend} (the {target} build "
                    f"of jax is not installed here, or found no {target.upper()}): install it "
                    f"with `{INSTALL[target]}`")
  impl = run.get("model", {}).get("attention_impl")
  if impl == "splash" and backend != "tpu":
    problems.append(f"model.attention_impl='splash' on {backend} would run the Pallas TPU "
                    "kernel in interpret mode (for tests; very slow): use 'auto' or 'xla' here")
  if problems and not allow_mismatch:
    raise ValueError("; ".join(problems) + f" (or pass {OVERRIDE} to run it here anyway)")
  return [f"note: {p.split(':')[0]}: running anyway ({OVERRIDE})" for p in problems]

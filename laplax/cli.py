"""What train.py / eval.py share: one-line errors for bad input instead of tracebacks.

`run_main` prints exactly one `error: ...` line for a user error (bad config value, bad
data, corrupt checkpoint, locked workdir, non-finite loss, full disk in an async save), and
keeps full tracebacks for bugs. Orbax reports a failed background save twice through absl
logging, each time with the thread's traceback, before the same exception reaches the main
thread from wait_until_finished(); while run_main is active those records are held back,
and printed one line each only if main then succeeds. Set LAPLAX_DEBUG=1 to see everything.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pathlib
import re
import sys
import threading
import traceback
from typing import Callable, Iterator, Mapping

import jax

from laplax import multihost
from laplax import supervisor
from laplax.data.builders import DataError
from laplax.train.checkpoint import CheckpointError
from laplax.train import gcs
from laplax.train import shims
from laplax.train.loop import Preempted

USER_ERRORS = (ValueError, DataError, CheckpointError, OSError, KeyError)

# Python loggers whose INFO/WARNING chatter (every orbax file operation, jax compile notes)
# drowns a run's progress lines.
NOISY_LOGGERS = ("absl", "orbax", "jax._src", "tensorstore", "grain", "etils")
# Kept at WARNING: says which backend JAX picked (e.g. "a GPU is present but jaxlib has no CUDA").
USEFUL_LOGGERS = ("jax._src.xla_bridge",)


# XLA:CPU options laplax runs with (they change nothing on TPU / GPU). YNNPACK keeps the
# matmuls but gives reductions back to XLA's own emitter: jaxlib 0.10's default also routes
# reductions (LayerNorm statistics, bias gradients) through YNNPACK, which is slower on these
# small models: a ViT train step runs 8 % faster on two threads and 22 % faster on one
# (benchmarks/cpu_step_ratio.py, benchmarks/README.md).
# The collective timeouts: XLA:CPU runs each (fake) device's part of a sharded step on its own
# thread and aborts the process when one thread reaches an all-reduce 40 s after the others.
# On a loaded 2-core host, 8 fake devices' threads can be that far apart without any deadlock
# (a CI run of tests/integration/test_cli_processes.py died so, at step ~250 of 300): warn
# after 2 min, abort after 10.
CPU_XLA_FLAGS = ("--xla_cpu_experimental_ynn_fusion_type=individual_dot",
                 "--xla_cpu_collective_call_warn_stuck_timeout_seconds=120",
                 "--xla_cpu_collective_call_terminate_timeout_seconds=600")


def xla_flags(existing: str) -> str:
  """XLA_FLAGS with CPU_XLA_FLAGS added, except those the user already set (by name)."""
  names = {f.split("=", 1)[0] for f in existing.split()}
  extra = [f for f in CPU_XLA_FLAGS if f.split("=", 1)[0] not in names]
  return " ".join([existing.strip(), *extra]).strip()


def configure_xla() -> None:
  """Puts `xla_flags` into the environment; call before JAX starts a backend (which reads it)."""
  os.environ["XLA_FLAGS"] = xla_flags(os.environ.get("XLA_FLAGS", ""))


def fail(message: str, code: int = 2) -> None:
  """One `error:` line for a bad command line, then exit `code`."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(code)


# gloo (JAX's CPU collectives) prints '[Gloo] Rank N is connected to M peer ranks. Expected
# number of connected peer ranks is : M' to stdout from C++ for every new communicator, with
# no switch to turn it off. Threads write it piece by piece, so two messages can interleave
# into lines holding any mix of their pieces (a lone digit or an empty line among them).
GLOO_LINES = rb".*(\[Gloo\]|peer ranks|is connected to|Expected number of).*|\s*\d*\s*"


def drop_native_lines(pattern: bytes = GLOO_LINES, fd: int = 1) -> None:
  """Drops the lines that fully match `pattern` from file descriptor `fd` (output of native
  code that Python cannot silence) for the rest of the process. The lines pass through a pipe
  read by a thread; at exit what is left is drained."""
  read_end, write_end = os.pipe()
  original = os.dup(fd)
  sys.stdout.flush()
  os.dup2(write_end, fd)
  os.close(write_end)
  drop = re.compile(pattern)

  def forward():
    pending = b""
    while chunk := os.read(read_end, 1 << 16):
      *lines, pending = (pending + chunk).split(b"\n")
      kept = b"".join(line + b"\n" for line in lines if not drop.fullmatch(line))
      if kept:
        os.write(original, kept)
    if pending and not drop.fullmatch(pending):
      os.write(original, pending)

  thread = threading.Thread(target=forward, name="drop_native_lines", daemon=True)
  thread.start()

  def restore():
    with contextlib.suppress(Exception):
      sys.stdout.flush()
    os.dup2(original, fd)  # the pipe's last write end closes: the thread sees its end
    thread.join(timeout=5)  # child processes (data workers) may still hold the pipe

  atexit.register(restore)


# A host that sends no heartbeat for this long is lost (JAX's default, 100 s, kept the others
# of a 2-host job waiting 87 s for a killed one).
HEARTBEAT_TIMEOUT_S = 20


def define_multihost_flags() -> None:
  """train.py's and eval.py's --multihost and cluster flags."""
  from absl import flags
  flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize(): one process per "
                    "host (TPU pod slice, SLURM, or the three flags below). The process then "
                    "runs in a watched child (laplax.supervisor): when another host is lost, "
                    "it stops with one line naming that host, exit 75.")
  flags.DEFINE_string("coordinator_address", None, "With --multihost: host:port of process 0 "
                      "(default: detected from the cluster, e.g. TPU metadata or SLURM).")
  flags.DEFINE_integer("num_processes", None, "With --multihost: the number of processes.")
  flags.DEFINE_integer("process_id", None, "With --multihost: this process's index.")
  flags.DEFINE_integer("heartbeat_timeout", HEARTBEAT_TIMEOUT_S, "With --multihost: seconds "
                       "without a heartbeat after which a host counts as lost and every other "
                       "host stops (within about this time plus 5 s).")


def join_from_flags(flag_values) -> None:
  """--multihost: joins the job (one line and exit 1 on failure); without it, refuses the
  cluster flags."""
  f = flag_values
  if f.multihost:
    drop_native_lines()  # gloo's chatter; before initialize, whose atexit runs first
    run_main(lambda: initialize_distributed(f.coordinator_address, f.num_processes,
                                            f.process_id, heartbeat_timeout_s=f.heartbeat_timeout))
  elif any(v is not None for v in (f.coordinator_address, f.num_processes, f.process_id)):
    fail("--coordinator_address, --num_processes and --process_id need --multihost")


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None,
                           process_id: int | None = None, *,
                           heartbeat_timeout_s: int = HEARTBEAT_TIMEOUT_S) -> None:
  """`jax.distributed.initialize` for a multi-process run: the three values when given, else
  JAX's cluster detection (TPU metadata, SLURM, Open MPI, ...). Raises ValueError (one line)
  for bad values or when no cluster can be found or joined. A process that sends no heartbeat
  for `heartbeat_timeout_s` is lost: the runtime then stops every other process (the
  supervisor turns that into one line, laplax.supervisor), told here who is who."""
  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit) and any(v is None for v in explicit):
    raise ValueError("--coordinator_address, --num_processes and --process_id go together "
                     "(or none of them, to detect the cluster)")
  if num_processes is not None and not (num_processes >= 1 and 0 <= process_id < num_processes):
    raise ValueError(f"--process_id={process_id} must be in [0, --num_processes="
                     f"{num_processes})")
  if coordinator_address is not None and not re.fullmatch(r"\[?[\w.:-]+\]?:\d+",
                                                          coordinator_address):
    raise ValueError(f"--coordinator_address={coordinator_address!r}: use host:port")
  if heartbeat_timeout_s < 2:
    raise ValueError(f"--heartbeat_timeout={heartbeat_timeout_s}: use at least 2 seconds")
  try:
    jax.distributed.initialize(coordinator_address, num_processes, process_id,
                               heartbeat_timeout_seconds=heartbeat_timeout_s)
  except (ValueError, RuntimeError) as e:  # RuntimeError: no coordinator reached in time
    raise ValueError(f"--multihost: {one_line(e, 200)} (on a TPU pod slice or a SLURM job the "
                     "cluster is detected; elsewhere pass --coordinator_address, "
                     "--num_processes and --process_id)") from None
  multihost.cache_on_every_cpu_process()
  supervisor.tell(process=jax.process_index(), heartbeat_timeout=heartbeat_timeout_s,
                  hosts=multihost.host_table())


def _debug() -> bool:
  return os.environ.get("LAPLAX_DEBUG", "") not in ("", "0")


def quiet_logging() -> None:
  """absl verbosity WARNING, and ERROR for the Python loggers of orbax, absl, jax & co."""
  if _debug():
    return
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.WARNING)
  absl_logging.set_stderrthreshold(absl_logging.ERROR)
  for name in NOISY_LOGGERS:
    logging.getLogger(name).setLevel(logging.ERROR)
  for name in USEFUL_LOGGERS:
    logging.getLogger(name).setLevel(logging.WARNING)


def one_line(e: BaseException, limit: int = 400) -> str:
  """An exception's message folded onto one line (config_flags nests newlines and quotes)."""
  text = str(e).replace("\\n", "\n").replace("\\'", "'")
  if "Traceback (most recent call last)" in text:
    # config_flags embeds the config file's traceback: keep its head and the final error line.
    head, _, tail = text.partition("Traceback (most recent call last)")
    last = [l for l in tail.splitlines() if l.strip() and not l.startswith((" ", "\t"))]
    text = head.rstrip(": \n") + ": " + (last[-1] if last else "")
  text = " ".join(part.strip() for part in text.splitlines() if part.strip()).strip("'\" ")
  text = text or type(e).__name__
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _config_file_error(e: BaseException) -> str:
  """'<file>:<line>: <Type>: <message>' for an error raised by executing a config file."""
  if isinstance(e, SyntaxError):
    where = f"{e.filename}:{e.lineno}" if e.filename else "config file"
    return f"{where}: {type(e).__name__}: {e.msg}"
  frames = traceback.extract_tb(e.__traceback__)
  # The innermost frame outside site-packages is the user's config file (or its helpers).
  own = [f for f in frames if "site-packages" not in f.filename and "<frozen" not in f.filename]
  frame = (own or frames or [None])[-1]
  where = f"{frame.filename}:{frame.lineno}: " if frame is not None else ""
  return f"{where}{type(e).__name__}: {one_line(e)}"


def _missing_field(e: BaseException, argv: list[str]) -> str | None:
  """'--config.model.depth: the config has no field 'depth'' when `e` is config_flags' bare
  AttributeError("'depth'") / KeyError('depth') for an override of a field that is not there."""
  if not isinstance(e, (AttributeError, KeyError)) or not e.args:
    return None
  key = one_line(e)
  named = [a.split("=")[0] for a in argv[1:]
           if a.startswith("--config.") and a.split("=")[0].rsplit(".", 1)[-1] == key]
  return f"{named[0]}: the config has no field {key!r}" if named else None


def _moved_flag(argv: list[str]) -> str | None:
  """'--config.mixup.prob: config.mixup is gone: write --config.loss.mixup.prob' for an override
  of a key that has moved (laplax.train.shims.MOVED)."""
  for arg in argv[1:]:
    path = arg.split("=")[0][len("--config."):] if arg.startswith("--config.") else None
    for old, new in (shims.MOVED.items() if path else ()):
      if path == old or (path.startswith(old + ".") and old != "loss"):
        return (f"--config.{path}: config.{old} is gone: write --config.{new}"
                f"{path[len(old):]}")
  return None


def _gone_flag(argv: list[str], gone: Mapping[str, str]) -> str | None:
  """'--limit is gone: write --set=lm_tasks.limit=N' for a flag of `gone` ({flag: what to
  write now})."""
  for arg in argv[1:]:
    name = arg.lstrip("-").split("=")[0] if arg.startswith("--") else None
    if name in gone:
      return f"--{name} is gone: write {gone[name]}"
  return None


def flag_error(e: BaseException, argv: list[str], gone: Mapping[str, str] | None = None) -> str:
  """The one line for a failed parse of `argv` (a moved key or a removed flag, a missing field,
  a bad value)."""
  return (_moved_flag(argv) or _gone_flag(argv, gone or {}) or _missing_field(e, argv)
          or one_line(e))


# What absl flag parsing raises for a bad command line (config_flags' overrides included).
FLAG_ERRORS = (AttributeError, KeyError, TypeError, ValueError)


def config_package_roots(argv: list[str]) -> list[str]:
  """The folders a --config file's own imports need on sys.path: for a file inside a package
  (configs/pod/x.py, where configs/ and configs/pod/ hold __init__.py), the folder above its top
  package (the repository root), so that its `from configs import common` works wherever the
  command starts (a console script, laplax-train, puts only its bin/ folder on sys.path; `python
  train.py` the repository root). A file in no package (one built from laplax.presets): none."""
  roots = []
  for i, arg in enumerate(argv[1:], 1):
    if arg.startswith("--config="):
      value = arg[len("--config="):]
    elif arg == "--config" and i + 1 < len(argv):
      value = argv[i + 1]
    else:
      continue
    # path[:argument], split as config_flags splits it
    folder = pathlib.Path(value.split(":", 1)[0]).expanduser().absolute().parent
    if not (folder / "__init__.py").is_file():
      continue
    while (folder.parent / "__init__.py").is_file():
      folder = folder.parent
    roots.append(str(folder.parent))
  return roots


def as_main_module(name: str, doc: str | None) -> None:
  """Lets the command module `name` speak as the script run: absl's --help prints __main__'s
  docstring and the flags of the module sys.argv[0] names, and the script (a console script,
  train.py / eval.py) defines none; so `doc` and `name`'s flags."""
  from absl import flags
  sys.modules["__main__"].__doc__ = doc
  for flag in flags.FLAGS.get_key_flags_for_module(name):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def parse_flags(argv: list[str], gone: Mapping[str, str] | None = None) -> list[str]:
  """absl flag parsing with a one-line error (bad flag, config typo, bad value, broken config
  file, a flag in `gone`: what to write instead) and exit 2. A --config file's package is
  importable (config_package_roots)."""
  from absl import flags
  sys.path.extend(root for root in dict.fromkeys(config_package_roots(argv))
                  if root not in sys.path)
  try:
    return flags.FLAGS(argv)
  except (flags.Error, *FLAG_ERRORS) as e:
    print(f"error: {flag_error(e, argv, gone)}", file=sys.stderr)
    sys.exit(2)
  except Exception as e:  # pylint: disable=broad-except  # raised by executing a config file
    if _debug():
      raise
    print(f"error: config file failed: {_config_file_error(e)}", file=sys.stderr)
    sys.exit(2)


class _HoldBackgroundErrors(logging.Filter):
  """Holds back ERROR records that carry a traceback or come from orbax."""

  def __init__(self):
    super().__init__()
    self.held: list[logging.LogRecord] = []

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno >= logging.ERROR and (
        record.exc_info or "orbax" in record.pathname or record.name.startswith("orbax")):
      self.held.append(record)
      return False
    return True


@contextlib.contextmanager
def _quiet_failures() -> Iterator[tuple[_HoldBackgroundErrors, list]]:
  """While active: orbax/absl error records and dying threads print nothing (collected)."""
  held = _HoldBackgroundErrors()
  # Logger filters see only records logged on that logger itself (orbax logs on 'absl'),
  # handler filters also see records propagated from child loggers.
  loggers = [logging.getLogger(n) for n in ("absl", "orbax")]
  loggers += list(logging.getLogger().handlers)
  thread_failures: list[tuple[str, BaseException | None]] = []

  def excepthook(args):
    if args.exc_type is SystemExit:
      return
    thread_failures.append((getattr(args.thread, "name", "?"), args.exc_value))

  old_hook = threading.excepthook
  for logger in loggers:
    logger.addFilter(held)
  threading.excepthook = excepthook
  try:
    yield held, thread_failures
  finally:
    threading.excepthook = old_hook
    for logger in loggers:
      logger.removeFilter(held)


def _drop_closed_loop_noise(previous=sys.unraisablehook):
  """A sys.unraisablehook without asyncio's 'Event loop is closed': a failed async save (a full
  disk) leaves tensorstore callbacks that reach orbax's closed event loop during shutdown, and
  each printed a traceback (up to 98 of them) around the one error line."""

  def hook(unraisable):
    exc = unraisable.exc_value
    if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
      return
    previous(unraisable)
  return hook


def run_main(main: Callable[[], object]) -> None:
  """Runs `main`; a user error prints 'error: <one line>' and exits 1; Ctrl-C exits 130.

  Errors logged by background threads (orbax async saves) are printed only as one line
  each, and only if main succeeds; the same failure reaching main prints just its line.
  """
  if _debug():
    main()
    return
  quiet_logging()
  sys.unraisablehook = _drop_closed_loop_noise()  # for the rest of the process: shutdown too
  with _quiet_failures() as (held, thread_failures):
    try:
      try:
        main()
      except Exception as e:  # a collective or barrier that failed because a host was lost
        if supervisor.supervised() and supervisor.peer_lost(e):
          supervisor.await_host_loss(one_line(e))  # the runtime names the lost host
        raise
    except KeyboardInterrupt:
      print("interrupted: the latest checkpoint is kept; rerun the same command to resume",
            file=sys.stderr)
      sys.exit(130)
    except Preempted as e:  # SIGTERM / preemption: saved, then stopped on purpose
      print(str(e), file=sys.stderr)
      sys.exit(143)
    except USER_ERRORS as e:
      print(f"error: {gcs.store_error(e) or one_line(e)}", file=sys.stderr)
      sys.exit(1)
    except SystemExit:
      raise
    except BaseException:
      # A bug: everything held back may explain it, tracebacks included.
      formatter = logging.Formatter("%(levelname)s:%(name)s:%(message)s")
      for record in held.held:
        print(formatter.format(record), file=sys.stderr)
      raise
  for record in held.held:
    print(f"warning: {one_line(Exception(record.getMessage()))}", file=sys.stderr)
  for name, exc in thread_failures:
    print(f"warning: background thread {name} failed: "
          f"{type(exc).__name__}: {one_line(exc) if exc is not None else ''}", file=sys.stderr)

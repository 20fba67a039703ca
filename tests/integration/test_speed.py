"""laplax's XLA:CPU flags reach the compiler, each checked in a fresh process: a device thread late
to an all-reduce is waited for, not an abort; matmuls stay YNNPACK fusions and reductions are
XLA's own.
In-process checks of the speed-ups and the flags: tests/unit/test_speed.py."""

import os
import subprocess
import sys

import pytest

from conftest import REPO
from laplax import cli


_STRAGGLER = """
import time, jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from laplax import cli
if CONFIGURE:
  cli.configure_xla()
mesh = jax.make_mesh((8,), ("d",))

def late(i):  # device 7 reaches the all-reduce SECONDS s after the other seven
  if int(i) == 7:
    time.sleep(SECONDS)
  return np.float32(i)

def f(x):
  i = jax.lax.axis_index("d")
  return jax.lax.psum(x + jax.pure_callback(late, jax.ShapeDtypeStruct((), jnp.float32), i), "d")

g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P()))
print(float(g(jax.device_put(jnp.ones(8), NamedSharding(mesh, P("d"))))[0]))
"""


def test_a_device_thread_late_to_an_all_reduce_is_waited_for():
  """XLA:CPU aborts the process when one device's thread reaches a collective the flag's
  seconds after the others (40 s by default; 3 s here, to see it without waiting): laplax's
  flags set it to 10 minutes, so the same late thread is waited for."""
  limit = "--xla_cpu_collective_call_terminate_timeout_seconds"
  assert f"{limit}=600" in cli.CPU_XLA_FLAGS
  cwd = REPO

  def run(configure, flags):
    code = _STRAGGLER.replace("CONFIGURE", str(configure)).replace("SECONDS", "5")
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu",
             "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 {flags}"})
  aborted = run(False, f"{limit}=3 --xla_cpu_collective_call_warn_stuck_timeout_seconds=1")
  assert aborted.returncode != 0 and "Termination timeout" in aborted.stderr, aborted.stderr
  waited = run(True, "")
  assert waited.returncode == 0, waited.stderr
  assert float(waited.stdout.split()[-1]) == 8 + sum(range(8))


_PROBE = """
from laplax import cli
if CONFIGURE:
  cli.configure_xla()
import jax, jax.numpy as jnp
# A matmul and a LayerNorm's statistics: a mean over the features of (B, T, E) activations.
f = jax.jit(lambda x, w: (x.reshape(-1, 64) @ w, jnp.mean(x, axis=-1)))
hlo = f.lower(jnp.ones((16, 17, 64)), jnp.ones((64, 32))).compile().as_text()
ynn = [line for line in hlo.splitlines() if "__ynn_fusion" in line and " fusion(" in line]
print(sum("dot_general" in l for l in ynn), sum("reduce" in l for l in ynn))
"""


@pytest.mark.parametrize("configure", [True, False])
def test_configure_xla_keeps_matmuls_in_ynnpack_and_gives_reductions_to_xla(configure):
  """In a fresh process (XLA reads XLA_FLAGS once): with laplax's flags the matmul is a YNNPACK
  fusion and the reduction is XLA's own; jaxlib's default routes both through YNNPACK (the
  slower choice on the CPU, benchmarks/README.md) - if that default changes, revisit the flag."""
  env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-c", _PROBE.replace("CONFIGURE", str(configure))],
                       env=env, capture_output=True, text=True, check=True,
                       cwd=REPO)
  dots, reductions = map(int, out.stdout.split())
  assert dots == 1
  assert reductions == (0 if configure else 1)

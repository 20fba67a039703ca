"""Multi-slice meshes (laplax.sharding.make_mesh with mesh.dcn_data / dcn_fsdp) and the fit check
for several slices (`train.py --aot=TOPOLOGY --slices=N`, laplax.train.aot).

The meshes are built from the devices of TPU topologies of 2 slices (libtpu's compile-only
devices, which carry `slice_index`), the compiles are the tiny test ViT's real train step for
2 x v5e:2x2 on this CPU host (10-20 s each). Without libtpu (requirements-tpu.txt, an optional
install) those tests are skipped with that reason; the CPU ones run anywhere.

What a compiled multi-slice program looks like (libtpu 0.0.42): one slice's program, whose
collectives' replica_groups name that slice's chips only (ICI), while every transfer between
slices is a send / recv pair for the megascale runtime (DCN) tagged with the collective it
implements (`_xla_megascale_transfer_type`): aot.dcn_transfers reads those.
"""

import re

import jax
import numpy as np
import pytest

from conftest import make_config
from laplax import sharding
from unit.test_configs import CONFIGS, _load, _parse


@pytest.fixture(scope="module")
def aot():
  pytest.importorskip("libtpu", reason="TPU compiles need libtpu: pip install -r "
                      "requirements-tpu.txt")
  from laplax.train import aot
  return aot


@pytest.fixture(scope="module")
def two_slices(aot):
  """The 32 devices of two v5e:4x4 slices."""
  return aot.topology_devices("v5e:4x4", 2)


def _slices(mesh) -> np.ndarray:
  return np.vectorize(lambda d: d.slice_index)(mesh.devices)


def test_topology_devices_of_two_slices(two_slices):
  assert len(two_slices) == 32
  assert sorted({d.slice_index for d in two_slices}) == [0, 1]
  assert [sum(d.slice_index == s for d in two_slices) for s in (0, 1)] == [16, 16]


def test_dcn_data_puts_the_slices_on_the_data_axis(two_slices):
  # FSDP within each slice, data parallel over the two: mesh (data 2, fsdp 16, model 1).
  mesh = sharding.make_mesh({"data": 1, "fsdp": -1, "model": 1, "dcn_data": 2}, two_slices)
  assert mesh.axis_names == sharding.MESH_AXES
  assert dict(mesh.shape) == {"data": 2, "fsdp": 16, "model": 1}
  assert set(mesh.devices.flat) == set(two_slices)
  slices = _slices(mesh)
  assert (slices[0] == 0).all() and (slices[1] == 1).all()  # an fsdp group: one whole slice
  # -1: the rest of the slices, the same mesh.
  same = sharding.make_mesh({"data": 1, "fsdp": -1, "dcn_data": -1}, two_slices)
  assert (same.devices == mesh.devices).all()


def test_data_axis_is_dcn_times_ici(two_slices):
  # Per slice 2 x 4 x 2 (data x fsdp x model); the global 'data' axis of 4 = 2 slices x 2.
  mesh = sharding.make_mesh({"data": 2, "fsdp": 4, "model": 2, "dcn_data": 2}, two_slices)
  assert dict(mesh.shape) == {"data": 4, "fsdp": 4, "model": 2}
  slices = _slices(mesh)
  for f in range(4):
    for m in range(2):
      # every 'data' group: the slice's own data rows first, then the other slice's
      assert slices[:, f, m].tolist() == [0, 0, 1, 1]
  # every fsdp and model group stays within one slice: their collectives are ICI only
  for d in range(4):
    assert len(set(slices[d].flat)) == 1
  # each slice's 16 devices fill its quarter-blocks exactly once
  assert sorted(x.id for x in mesh.devices[:2].flat) == sorted(
      x.id for x in two_slices if x.slice_index == 0)


def test_dcn_fsdp_puts_the_slices_on_the_fsdp_axis(two_slices):
  mesh = sharding.make_mesh({"data": 1, "fsdp": -1, "dcn_fsdp": 2}, two_slices)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 32, "model": 1}
  assert _slices(mesh)[0, :, 0].tolist() == [0] * 16 + [1] * 16


def test_one_slice_meshes_are_unchanged(aot):
  devices = aot.topology_devices("v5e:2x2")
  assert sharding.slice_count(devices) == 1
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "model": 1, "dcn_data": 1}, devices)
  expected = jax.make_mesh((4, 1, 1), sharding.MESH_AXES, devices=devices)
  assert (mesh.devices == expected.devices).all()
  # every device on the data axis (what the offline evaluation falls back to): any slice count
  assert dict(sharding.make_mesh(sharding.EVERY_DEVICE, devices).shape)["data"] == 4


def test_cpu_devices_are_one_slice():
  devices = jax.devices()
  assert sharding.slice_count(devices) == 1
  mesh = sharding.make_mesh(sharding.EVERY_DEVICE, devices)
  assert dict(mesh.shape) == {"data": len(devices), "fsdp": 1, "model": 1}
  with pytest.raises(ValueError, match=r"mesh.dcn_data=2, mesh.dcn_fsdp=1 asks for 2 slices, "
                     r"but these devices are 1 slice .*--aot=TOPOLOGY --slices=2"):
    sharding.make_mesh({"data": -1, "dcn_data": 2}, devices)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_mesh_holds_the_dcn_keys(name):
  # A multi-slice run sets them from the command line (--config.mesh.dcn_data=N): every run
  # config, a study's base and a chat stage keep them (a pod config updates its mesh, not
  # replaces it).
  config = _load(name)
  run = config.base if "base" in config else config
  if "mesh" in run:
    assert {"dcn_data", "dcn_fsdp"} <= set(run.mesh), run.mesh


def test_dcn_data_is_set_from_the_command_line():
  config = _parse("pod.gpt_d20", "--config.mesh.dcn_data=2")
  assert config.mesh.to_dict() == {"data": 1, "fsdp": -1, "model": 1, "dcn_data": 2,
                                   "dcn_fsdp": 1}


@pytest.mark.parametrize("shape, message", [
    # the config's default (dcn 1) on devices of two slices: names the fix
    ({"data": -1}, r"asks for 1 slice, but these devices are 2 slices .*"
                   r"--config.mesh.dcn_data=2 \(or -1"),
    ({"data": -1, "dcn_data": 4}, r"mesh.dcn_data=4, mesh.dcn_fsdp=1 asks for 4 slices, but "
                                  r"these devices are 2 slices"),
    ({"data": -1, "dcn_data": -1, "dcn_fsdp": 3}, r"mesh.dcn_data=-1, mesh.dcn_fsdp=3 does not "
                                                  r"divide the 2 slices"),
    ({"data": -1, "dcn_data": -1, "dcn_fsdp": -1}, r"at most one of them -1"),
    ({"data": -1, "dcn_data": 0}, r"slice counts >= 1"),
    ({"data": 3, "dcn_data": 2}, r"must fill each slice's 16 devices"),
    ({"data": -1, "dcn_model": 2}, r"mesh axes \['dcn_model'\] are unknown"),
])
def test_bad_dcn_meshes_are_one_line(two_slices, shape, message):
  with pytest.raises(ValueError, match=message):
    sharding.make_mesh(shape, two_slices)


@pytest.mark.parametrize("slices", [0, -1])
def test_slice_count_below_one_is_refused(aot, slices):
  with pytest.raises(ValueError, match=rf"--slices={slices}: a slice count is a whole number "
                     ">= 1"):
    aot.topology_devices("v5e:2x2", slices)


def test_fit_check_refuses_a_mesh_for_other_slices_before_compiling(aot, tmp_path):
  # The config's mesh (dcn 1) does not lay out 2 slices: refused, nothing compiled or written.
  with pytest.raises(ValueError, match=r"--config.mesh.dcn_data=2"):
    aot.fit_check(make_config("vit"), tmp_path, "v5e:2x2", log=lambda s: None, slices=2)
  # More slices than the batch has rows per data-parallel device: the task's batch check.
  with pytest.raises(ValueError, match=r"data.batch_size=64 must be a positive multiple of "
                     r"data-parallel devices \(80\)"):
    aot.fit_check(make_config("vit", **{"mesh.dcn_data": -1}), tmp_path, "v5e:2x2",
                  log=lambda s: None, slices=20)
  assert not (tmp_path / "aot.json").exists()


# --- The compiled program -------------------------------------------------------------------

def _compile(aot, shape, slices, tmp_path):
  """aot.fit_check's result and the compiled program's text for the test ViT (mesh `shape`)."""
  texts = []
  memory = aot.memory

  def keep(compiled):  # the fit check's own compile, read once more
    texts.append(compiled.as_text())
    return memory(compiled)

  config = make_config("vit", **{f"mesh.{k}": v for k, v in shape.items()})
  aot.memory = keep
  try:
    # With the persistent cache off the check compiles even where another test (or an earlier
    # run sharing the cache) checked this program: its figures would be read back, no text.
    with aot.no_compilation_cache():
      result = aot.fit_check(config, tmp_path, "v5e:2x2", log=lambda s: None, slices=slices)
  finally:
    aot.memory = memory
  assert "compiled_before" not in result and len(texts) == 1
  return result, texts[0]


def _replica_groups(hlo: str) -> list[list[int]]:
  """Every collective's device groups: explicit {{0,1},{2,3}} or iota [G,S]<=[dims]T(perm)."""
  groups = []
  for m in re.finditer(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", hlo):
    dims = [int(d) for d in m[3].split(",")]
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    if m[4]:
      ids = ids.transpose([int(d) for d in m[4].split(",")])
    groups += ids.reshape(int(m[1]), int(m[2])).tolist()
  for m in re.finditer(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", hlo):
    groups += [[int(i) for i in g.split(",") if i] for g in re.findall(r"\{([\d,]*)\}", m[1])]
  return groups


@pytest.fixture(scope="module")
def compiled_two_slices(aot, tmp_path_factory):
  # FSDP over each slice's 4 chips, data parallel over the 2 slices.
  return _compile(aot, {"data": 1, "fsdp": -1, "dcn_data": 2}, 2,
                  tmp_path_factory.mktemp("two"))


def test_only_the_gradient_all_reduce_crosses_slices(aot, compiled_two_slices):
  result, hlo = compiled_two_slices
  assert result["slices"] == 2 and result["chips"] == 8 and result["fits"] is True
  assert result["mesh"] == {"data": 2, "fsdp": 4, "model": 1}
  assert result["dcn_mesh"] == {"data": 2, "fsdp": 1, "model": 1}
  # Within a slice: the FSDP parameter all-gathers, over that slice's 4 chips (ids 0-3 of the
  # one slice's program), never a group reaching past them.
  groups = _replica_groups(hlo)
  assert re.search(r" all-gather\(", hlo) and groups
  assert max(max(g) for g in groups if g) == 3
  # Across slices: only all-reduces (the gradients' data-parallel mean), no all-gather or
  # reduce-scatter of FSDP parameters.
  transfers = aot.dcn_transfers(hlo)
  assert set(transfers) == {"ALL_REDUCE"}, transfers
  assert result["dcn_transfers"] == transfers
  # At least every gradient of this chip's share crosses once: float32, the parameters split
  # over the slice's 4 chips at best (the ViT's norms and biases are replicated).
  assert result["dcn_bytes_per_chip"] == transfers["ALL_REDUCE"]["bytes"]
  assert result["dcn_bytes_per_chip"] >= 4 * result["params"] / 4


def test_fsdp_over_slices_gathers_parameters_across_dcn(aot, tmp_path):
  # The control: FSDP spread over both slices (dcn_fsdp) makes parameter all-gathers (or
  # their reduce-scatters) cross DCN, which the check above would catch.
  result, hlo = _compile(aot, {"data": 1, "fsdp": -1, "dcn_fsdp": 2}, 2, tmp_path)
  assert result["mesh"] == {"data": 1, "fsdp": 8, "model": 1}
  assert set(aot.dcn_transfers(hlo)) - {"ALL_REDUCE"}, aot.dcn_transfers(hlo)


def test_two_slices_hold_what_one_slice_holds_per_chip(aot, compiled_two_slices, tmp_path):
  # Data parallelism over slices replicates each slice's train state: per chip the same
  # donated state (parameters and moments, the FSDP split of one slice) as one slice with the
  # same per-slice mesh; only the batch's share per chip halves.
  two, _ = compiled_two_slices
  one, hlo = _compile(aot, {"data": 1, "fsdp": -1, "dcn_data": 1}, 1, tmp_path)
  assert "dcn_bytes_per_chip" not in one and not aot.dcn_transfers(hlo)
  assert one["mesh"] == {"data": 1, "fsdp": 4, "model": 1} and one["slices"] == 1
  assert one["alias_bytes"] == two["alias_bytes"] > 0
  assert one["output_bytes"] == two["output_bytes"]
  assert two["argument_bytes"] < one["argument_bytes"]  # 8 rows of the batch per chip, not 16

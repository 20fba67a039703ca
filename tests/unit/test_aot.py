"""Ahead-of-time fit check (laplax.train.aot, `train.py --aot=TOPOLOGY`) and the analytic FLOP
count (laplax.flops).

The FLOP tests run anywhere. The TPU compiles need libtpu (requirements-tpu.txt, an optional
install): without it they are skipped with that reason. They compile the tiny test configs (not
the pod configs: minutes each) for v5e:2x2 (4 chips) on this CPU host, about 5-25 s each.
The fit check through train.py processes: tests/integration/test_aot.py.
"""

import importlib
import json

import flax.linen as nn
import jax
from jax.experimental.compilation_cache import compilation_cache
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import make_config
from laplax import flops, sharding
from laplax.train import state as state_lib
from laplax.train import task as task_lib


def _abstract_params(config):
  task = task_lib.for_config(config)
  model = task.build_model()
  boxed = jax.eval_shape(lambda r: task.init_params(model, r), jax.random.key(0))
  return task, model, jax.tree.map(lambda x: getattr(x, "value", x), boxed,
                                   is_leaf=lambda x: hasattr(x, "value"))


def test_gpt_flops_match_a_hand_count():
  # test:lm: depth 2, width 32, 4 heads of 8, MLP 128, vocabulary 320 (a multiple of 64), no
  # biases. Per block q, k, v, out 4 x 32 x 32 + MLP 2 x 32 x 128 = 12,288; two blocks plus
  # lm_head 32 x 320 = 34,816 (the token embedding is a lookup: not counted).
  task, model, params = _abstract_params(make_config("lm"))
  assert flops.matmul_params(params) == 2 * (4 * 32 * 32 + 2 * 32 * 128) + 32 * 320 == 34_816
  b, t = 16, 32  # data.batch_size, data.seq_len
  per_token = 6 * 34_816 + 12 * 2 * t * 32  # 6 N + 12 L T d, d = 4 heads x 8
  assert task.flops_per_step(model, params) == b * t * per_token == 119_537_664
  # Scanned blocks stack the same parameters under a leading layers axis: the same count.
  _, _, scanned = _abstract_params(make_config("lm", **{"model.scan_layers": True}))
  assert flops.matmul_params(scanned) == 34_816


def test_vit_flops_match_a_hand_count():
  # test:vit: preset mu (width 32, depth 2, 2 heads, MLP 64), patch 7 on 28 x 28 x 1: 16 patches
  # + the class token = 17 tokens. Patch projection 7 x 7 x 1 x 32 = 1,568; per block q, k, v,
  # out 4 x 32 x 32 + MLP 2 x 32 x 64 = 8,192; classifier 32 x 10 = 320 (biases, norms,
  # LayerScale, position table and class token are not matmuls).
  task, model, params = _abstract_params(make_config("vit"))
  n = 1568 + 2 * (4 * 32 * 32 + 2 * 32 * 64) + 320
  assert flops.matmul_params(params) == n == 18_272
  assert task.flops_per_step(model, params) == 64 * 17 * (6 * n + 12 * 2 * 17 * 32)
  _, _, scanned = _abstract_params(make_config("vit", **{"model.scan_layers": True}))
  assert flops.matmul_params(scanned) == n


def test_dino_flops_match_a_hand_count():
  # test:dino: the mu backbone on 2 global crops of 28 px (17 tokens) and 2 local crops of 14 px
  # (1 + 4 tokens); backbone N = 18,272 - 320 + 32 (a 1-class classifier), head 32 x 64 + 64 x 64
  # + 64 x 32 + last layer 32 x 128. Student: forward + backward on all 4 crops; teacher: forward
  # on the 2 global crops; the head once per crop.
  task, model, params = _abstract_params(make_config("dino"))
  n, nh = 17_984, 32 * 64 + 64 * 64 + 64 * 32 + 32 * 128
  assert (flops.matmul_params(params["backbone"]), flops.matmul_params(params["head"])) == (n, nh)
  attn = lambda t: 2 * t * 32  # L T d
  student = 2 * 17 * (6 * n + 12 * attn(17)) + 2 * 5 * (6 * n + 12 * attn(5)) + 6 * nh * 4
  teacher = 2 * 17 * (2 * n + 4 * attn(17)) + 2 * nh * 2
  assert task.flops_per_step(model, params) == 64 * (student + teacher)


def test_forward_only_flops_are_a_third():
  kw = dict(layers=2, seq_len=10, attn_dim=8, sequences=3)
  assert flops.transformer_flops(100, **kw) == 3 * flops.transformer_flops(100, backward=False,
                                                                           **kw)


def test_mfu_uses_the_chips_peak():
  # 16 v5e chips doing 197e12 x 16 x 0.5 FLOPs in 1 s: half their bf16 peak.
  out = flops.utilisation(0.5 * 197e12 * 16, 1.0, 16, "TPU v5 lite")
  assert out == pytest.approx({"tflops_per_chip": 98.5, "mfu": 0.5})
  assert flops.peak_flops("TPU v5") == 459e12 and flops.peak_flops("TPU v4") == 275e12
  assert flops.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
  assert flops.peak_flops("NVIDIA A100-SXM4-40GB") == 312e12
  assert flops.peak_flops("cpu") is None
  assert flops.utilisation(2e12, 2.0, 1, "cpu") == {"tflops_per_chip": 1.0}


def test_abstract_batches_have_the_training_shapes():
  assert {k: (v.shape, str(v.dtype)) for k, v in
          task_lib.for_config(make_config("lm")).abstract_batch(16).items()} == {
              "tokens": ((16, 33), "int32")}
  assert {k: (v.shape, str(v.dtype)) for k, v in
          task_lib.for_config(make_config("vit")).abstract_batch(8).items()} == {
              "image": ((8, 28, 28, 1), "uint8"), "label": ((8,), "int32")}  # normalised in the step
  # DINO's views as the host pipeline cuts them (grey Fashion-MNIST: one channel).
  dino = task_lib.for_config(make_config("dino"))
  m = dino.config.multicrop
  assert {k: (v.shape, str(v.dtype)) for k, v in dino.abstract_batch(4).items()} == {
      "global": ((4, 2, m.global_size, m.global_size, 1), "uint8"),
      "local": ((4, m.num_local, m.local_size, m.local_size, 1), "uint8")}


def test_image_size_and_classes_override_the_data_set():
  config = make_config("vit", **{"data.name": "imagenet2012"})
  with pytest.raises(ValueError, match="or set data.image_size and data.num_classes"):
    task_lib.for_config(config).validate(dp=1, hosts=1)
  config.data.image_size = 56
  config.data.num_classes = 7
  task = task_lib.for_config(config)
  task.validate(dp=1, hosts=1)
  model = task.build_model()
  params = jax.eval_shape(lambda r: task.init_params(model, r), jax.random.key(0))
  assert nn.unbox(params)["embedding"]["kernel"].shape[:2] == (model.patch_size,) * 2
  assert task.abstract_batch(2)["image"].shape == (2, 56, 56, 3)
  assert task.build_model().num_classes == 7


@pytest.fixture(scope="module")
def aot():
  pytest.importorskip("libtpu", reason="TPU compiles need libtpu: pip install -r "
                      "requirements-tpu.txt")
  from laplax.train import aot
  return aot


# The LM also through the pod configs' memory path: splash attention as its Mosaic kernel under
# shard_map, scanned and rematerialised blocks, chunked cross-entropy.
MEMORY_PATH = {"model.attention_impl": "splash", "model.scan_layers": True,
               "model.remat_policy": "full", "loss.chunk": 8}


@pytest.mark.parametrize("kind", ["vit", "lm", "lm_memory_path"])
def test_fit_check_writes_aot_json(aot, kind, tmp_path, data_cache):
  config = make_config(kind.split("_")[0], data_cache,
                       **(MEMORY_PATH if kind == "lm_memory_path" else {}))
  result = aot.fit_check(config, tmp_path, "v5e:2x2", log=lambda s: None)
  saved = json.loads((tmp_path / "aot.json").read_text())
  assert saved == json.loads(json.dumps(result))
  for key in ("topology", "chips", "mesh", "params", "hbm_bytes_per_chip",
              "peak_bytes_per_chip", "argument_bytes", "output_bytes", "alias_bytes",
              "temp_bytes", "flops_per_step", "fits", "compile_seconds"):
    assert key in saved, key
  assert saved["topology"] == "v5e:2x2" and saved["chips"] == 4 and saved["fits"] is True
  assert saved["mesh"] == {"data": 4, "fsdp": 1, "model": 1}
  assert saved["hbm_bytes_per_chip"] == 16 * 2 ** 30
  task = task_lib.for_config(config)
  model = task.build_model()
  tx, _ = task.optimizer(10)
  abstract, _ = state_lib.abstract_state(task, model, tx, sharding.make_mesh(
      {"data": 1}, devices=jax.devices()[:1]), sharding.rules_from_config(()))
  assert saved["params"] == sum(x.size for x in jax.tree.leaves(abstract.params))
  assert saved["flops_per_step"] == task.flops_per_step(model, abstract.params)
  # The TPU compiler reports 0 temp bytes for some small programs (seen for the LM, and for
  # the ViT with the flat AdamW update) and its own peak instead: either way the peak holds
  # more than the arguments.
  assert saved["temp_bytes"] >= 0
  assert saved["peak_bytes_per_chip"] > saved["argument_bytes"] > 0
  # Replicated float32 params + 2 Adam moments at least, and the donated state aliased.
  assert saved["argument_bytes"] >= 3 * 4 * saved["params"]
  assert 0 < saved["alias_bytes"] <= saved["argument_bytes"]
  assert saved["peak_bytes_per_chip"] < 2 ** 30


def _set_jax_config(request, name: str, value) -> None:
  """jax.config.update(name, value) until the test ends. The persistent cache is reset both
  times: JAX keeps the directory and the on / off it found at a process's first compile."""
  previous = getattr(jax.config, name)
  jax.config.update(name, value)
  compilation_cache.reset_cache()

  def restore():
    jax.config.update(name, previous)
    compilation_cache.reset_cache()
  request.addfinalizer(restore)


def test_no_compilation_cache_compiles_afresh_and_the_cache_is_used_again_after(aot, tmp_path,
                                                                                request):
  # In a process whose first compile is inside the block (a fresh pytest worker, a fit check
  # first thing), and in one already using the cache: nothing is read or written inside, and
  # the compiles after it are cached again.
  _set_jax_config(request, "jax_compilation_cache_dir", str(tmp_path / "xla"))
  _set_jax_config(request, "jax_enable_compilation_cache", True)
  _set_jax_config(request, "jax_persistent_cache_min_compile_time_secs", 0.0)
  _set_jax_config(request, "jax_persistent_cache_min_entry_size_bytes", -1)
  entries = lambda: sorted(p.name for p in (tmp_path / "xla").glob("*") if p.is_file())
  x = np.arange(7.0, dtype=np.float32)
  with aot.no_compilation_cache():  # the first compile since the reset
    jax.jit(lambda v: v * 3.0 + 1.0)(x).block_until_ready()
  assert entries() == []
  jax.jit(lambda v: v * 5.0 - 2.0)(x).block_until_ready()
  cached = entries()
  assert cached
  with aot.no_compilation_cache():  # the cache in use
    jax.jit(lambda v: jnp.sin(v) * 7.0)(x).block_until_ready()
  assert entries() == cached
  jax.jit(lambda v: jnp.cos(v) * 11.0)(x).block_until_ready()
  assert len(entries()) > len(cached)


def test_a_program_compiled_before_is_read_back_not_compiled(aot, tmp_path, data_cache,
                                                              monkeypatch, request):
  """With JAX's persistent cache on, fit_check remembers a compile's figures by the lowered
  program, versions and flags: the same program again is not compiled and gives the same
  figures; another program (a bigger batch), or the cache off, compiles."""
  _set_jax_config(request, "jax_compilation_cache_dir", str(tmp_path / "xla"))
  _set_jax_config(request, "jax_enable_compilation_cache", True)
  config = make_config("vit", data_cache)
  first = aot.fit_check(config, tmp_path / "a", "v5e:2x2", log=lambda s: None)
  assert "compiled_before" not in first
  assert len(list((tmp_path / "xla" / "laplax_fit").glob("*.json"))) == 1
  compiles = []
  real = aot.StepProgram.compile
  monkeypatch.setattr(aot.StepProgram, "compile",
                      lambda self, *a: compiles.append(1) or real(self, *a))
  again = aot.fit_check(config, tmp_path / "b", "v5e:2x2", log=lambda s: None)
  assert compiles == [] and again.pop("compiled_before") is True
  assert again == first
  assert "(an earlier compile's figures)" in aot.summary({**again, "compiled_before": True})
  with config.unlocked():
    config.data.batch_size *= 2
  bigger = aot.fit_check(config, tmp_path / "c", "v5e:2x2", log=lambda s: None)
  assert compiles == [1] and "compiled_before" not in bigger
  assert bigger["argument_bytes"] > first["argument_bytes"]
  _set_jax_config(request, "jax_enable_compilation_cache", False)
  aot.fit_check(config, tmp_path / "d", "v5e:2x2", log=lambda s: None)
  assert compiles == [1, 1]


def _small(config, *, batch: int, seq_len: int):
  """A pod-scale config 2 blocks deep with `batch` examples per step (an LM's of `seq_len`
  tokens; DINO with 2 local crops; a per-layer head list cut to its last 2 layers)."""
  with config.unlocked():
    config.model.depth = 2
    config.data.batch_size = batch
    if "seq_len" in config.data:
      config.data.seq_len = seq_len
    if "multicrop" in config:
      config.multicrop.num_local = 2
    if "laplacian_heads" in config.model and not isinstance(config.model.laplacian_heads, int):
      config.model.laplacian_heads = tuple(config.model.laplacian_heads)[-2:]
  return config


POD_CONFIGS = ("gpt_d20", "gpt_fork_d20", "vit_b16_imagenet", "vit_b16_imagenet_ft224",
               "vit_b_cifar100", "dino_vit_s16")


@pytest.mark.slow
@pytest.mark.parametrize("name", POD_CONFIGS)
def test_pod_configs_compile_for_a_small_topology(aot, name, tmp_path):
  # Each pod config as shipped (its attention implementation, remat policy, scan, dtypes,
  # sharding rules, vocabulary / head sizes) but 2 blocks deep and 8 examples per step (the
  # GPTs on 512 of their 2048 tokens, still two chunks of the chunked loss: at 2048 one compile
  # took 72 s alone on 2 cores, 210 s beside the other test worker), so that it compiles for
  # v5e:2x2 in under a minute (DINO with 2 of its 10 local crops); the full-size figures are
  # in docs/pods.md.
  config = _small(importlib.import_module(f"configs.pod.{name}").get_config(), batch=8,
                  seq_len=512)
  result = aot.fit_check(config, tmp_path, "v5e:2x2", log=lambda s: None)
  assert result["fits"] is True and result["chips"] == 4
  assert 0 < result["peak_bytes_per_chip"] < 0.8 * result["hbm_bytes_per_chip"]
  # FSDP over the 4 chips: each holds about a quarter of the float32 params + 2 Adam moments.
  assert result["argument_bytes"] < 0.5 * 12 * result["params"]


GPU_CONFIGS = ("vit_b16_imagenet", "gpt_d20", "dino_vit_s16")


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_gpu_node_configs_compile_as_a_labelled_cpu_stand_in(name, tmp_path):
  """configs/gpu/: the pod config on one node of 8 GPUs (cuDNN attention, the pod's global
  batch over 8 devices) compiles on this host's 8 CPU devices for --aot=h100:8, labelled as the
  CPU compiler's estimate, with XLA attention in place of cuDNN's (no CPU lowering); 2 blocks
  deep and 16 examples per step (the GPT on 256 tokens) so that it compiles in seconds."""
  from laplax.train import aot
  config = importlib.import_module(f"configs.gpu.{name}").get_config()
  assert config.platform == "gpu" and config.model.attention_impl == "cudnn"
  pod = importlib.import_module(f"configs.pod.{name}").get_config()
  assert config.data.batch_size == pod.data.batch_size  # the recipe's global batch
  config = _small(config, batch=16, seq_len=256)
  result = aot.fit_check(config, tmp_path, "h100:8", log=lambda s: None)
  assert result["chips"] == 8 and result["hbm_bytes_per_chip"] == 80 * 2 ** 30
  assert "standing in for the GPU compiler" in result["compiled_by"]
  assert "[cpu compiler" in aot.summary(result)
  assert config.model.attention_impl == "cudnn"  # the caller's config is not changed
  assert result["fits"] is True and result["peak_bytes_per_chip"] > result["argument_bytes"] > 0
  # FSDP over the 8 devices: each holds about an eighth of the float32 params + 2 Adam moments
  assert result["argument_bytes"] < 0.25 * 12 * result["params"]


@pytest.mark.parametrize("topology,slices,message", [
    ("h100:0", 1, "GPUs per node as a whole number"),
    ("h100:x", 1, "GPUs per node as a whole number"),
    ("h100:64", 1, "compiles for 64 devices but this host has 8 cpu devices"),
    ("h100:8", 2, "GPU nodes are one mesh"),
    ("b200:8", 1, "unknown topology"),
])
def test_gpu_topology_bad_input(topology, slices, message):
  from laplax.train import aot
  with pytest.raises(ValueError, match=message):
    aot.topology_devices(topology, slices)

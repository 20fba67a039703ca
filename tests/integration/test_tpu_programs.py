"""benchmarks/tpu_programs.py's comparison of a train step's TPU programs at k = 0 and k > 0, on
the tiny LM with the pod configs' memory path (splash as its Mosaic kernel, scanned and
rematerialised blocks, chunked cross-entropy) and bf16 compute, compiled for v5e:2x2.

It needs libtpu (requirements-tpu.txt, an optional install): without it the test is skipped with
that reason, as tests/unit/test_aot.py's compiles are. Two compiles of a few seconds each.
"""

import pytest

from conftest import make_config

MEMORY_PATH = {"model.attention_impl": "splash", "model.scan_layers": True,
               "model.remat_policy": "full", "loss.chunk": 8, "model.dtype": "bfloat16"}


@pytest.fixture(scope="module")
def programs():
  pytest.importorskip("libtpu", reason="TPU compiles need libtpu: pip install -r "
                      "requirements-tpu.txt")
  from benchmarks import tpu_programs
  return tpu_programs


@pytest.mark.slow  # two TPU compiles
def test_laplacian_program_differs_from_the_baseline_where_the_heads_are(programs):
  result = programs.compare_config(make_config("lm", **MEMORY_PATH), 2, "v5e:2x2",
                                   log=lambda s: None)
  base, lap, comparison = result["base"], result["laplacian"], result["comparison"]
  # The heads change no parameter, and both programs are the same kind of step: the same
  # scanned-block loops (forward, backward) and the same splash kernels.
  assert comparison["params_equal"] and base["params"] == lap["params"] > 0
  assert len(base["loop_bodies"]) == len(lap["loop_bodies"]) > 0
  kernels = lambda ops: {op: v["count"] for op, v in ops.items() if "tpu_custom_call" in op}
  assert kernels(base["ops"]) == kernels(lap["ops"]) and kernels(base["ops"])
  # v - P V happens in the forward kernel's epilogue (laplax.kernels.splash): its output stays
  # in bf16 (the float32 P V it used to return for the bf16-exact combination would double it;
  # the epilogue adds one (block, head_dim) float32 buffer), and the heads add work, never remove.
  fwd = [key for key in base["ops"] if "splash_mha_fwd" in key]
  assert fwd and all(base["ops"][key]["bytes"] <= lap["ops"][key]["bytes"]
                     < 1.05 * base["ops"][key]["bytes"] for key in fwd)
  assert comparison["flops_ratio"] > 1 and comparison["bytes_ratio"] > 1
  # The same program compared with itself: ratios 1, nothing differs.
  same = programs.compare(base, base)
  assert same["flops_ratio"] == same["bytes_ratio"] == same["peak_ratio"] == 1
  assert same["differing_ops"] == [] and same["over_threshold"] == []
  assert "k = 2 vs 0" in programs.describe(result)

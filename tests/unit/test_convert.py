"""Converters against real PyTorch code: the same random weights give the same logits and
per-block outputs (float32, relative error < 1e-5), and laplax -> PyTorch -> laplax is bit-exact.

ViT: timm's VisionTransformer from PyPI (DeiT-III's layout with QK-norm, LayerScale and no class
position entry; DINO's vit_small layout with a class position entry; average pooling), its
Laplacian heads added by this file's own Attention subclass (what the authors' deit_mixed
MixedAttention does). GPT <-> nanochat: tests/unit/test_nanochat.py. Needs the test dependencies
(requirements-test.txt: bash scripts/setup.sh --test).
`python -m laplax.convert` as a process: tests/integration/test_convert.py.
"""

import json
import os

import numpy as np
import pytest

from conftest import make_config


def _require(name):
  if os.environ.get("LAPLAX_REQUIRE_DATA") == "1":  # CI installs them: missing is a failure
    return __import__(name)
  return pytest.importorskip(name, reason="a test dependency: bash scripts/setup.sh --test")


torch = _require("torch")
timm = _require("timm")
F = torch.nn.functional

from laplax import convert  # noqa: E402
from laplax.convert import checkpoints, vit as vit_convert  # noqa: E402
from laplax.evals import offline  # noqa: E402
from laplax.models import vit as vit_lib  # noqa: E402
from laplax.train import export  # noqa: E402
from timm.models.vision_transformer import Attention, VisionTransformer  # noqa: E402

TOL = 1e-5


def rel(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / np.abs(b).max())


def laplacian_attention(k: int):
  """timm's Attention whose last k heads return v - P V (the authors' MixedAttention)."""

  class LaplacianAttention(Attention):
    num_laplacian = k

    def forward(self, x, attn_mask=None, is_causal=False):
      b, n, _ = x.shape
      q, kk, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(
          2, 0, 3, 1, 4).unbind(0)
      y = F.scaled_dot_product_attention(self.q_norm(q), self.k_norm(kk), v)
      h = self.num_heads - self.num_laplacian
      y = torch.cat([y[:, :h], v[:, h:] - y[:, h:]], dim=1)
      return self.proj(self.norm(y.transpose(1, 2).reshape(b, n, self.attn_dim)))

  return LaplacianAttention


def randomise(module: "torch.nn.Module", seed: int = 0):
  """Every parameter random and far from identity: matrices N(0, 1/fan_in), LayerNorm and
  LayerScale gains 1 + N(0, 0.3^2), biases N(0, 0.3^2)."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in module.named_parameters():
      if p.ndim >= 2:
        p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
      elif name.endswith(("weight", "gamma")):
        p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
      else:
        p.copy_(0.3 * torch.randn(p.shape, generator=g))
  return module


def timm_vit(k: int, **kw):
  kw = {"img_size": 32, "patch_size": 8, "in_chans": 3, "num_classes": 5, "embed_dim": 64,
        "depth": 2, "num_heads": 4, "mlp_ratio": 2.0, "qkv_bias": True, **kw}
  return VisionTransformer(attn_layer=laplacian_attention(kw.pop("k", k)), **kw).eval()


def numpy_state(module):
  return {n: p.detach().numpy().copy() for n, p in module.state_dict().items()}


VIT_CASES = {
    # the authors' deit3_*_{k}L: QK-norm, LayerScale, no class position entry; 1 of 4 Laplacian
    "deit3_mixed": dict(k=1, qk_norm=True, init_values=1e-6, no_embed_class=True),
    # DINO's vit_small / timm's vit_*: class position entry, no LayerScale, no QK-norm
    "vit_dino": dict(k=0, qk_norm=False, init_values=None, no_embed_class=False),
    # all heads Laplacian, average pooling (normalise, then pool)
    "avg_all_laplacian": dict(k=4, qk_norm=True, init_values=1e-6, no_embed_class=True,
                              global_pool="avg", fc_norm=False),
}


@pytest.mark.parametrize("case", sorted(VIT_CASES))
def test_vit_matches_timm_and_round_trips_bit_exactly(case):
  kw = dict(VIT_CASES[case])
  k = kw.pop("k")
  tm = randomise(timm_vit(k, **kw), seed=len(case))
  state = numpy_state(tm)
  pool = "gap" if kw.get("global_pool") == "avg" else "cls"
  fields, flat = vit_convert.from_timm(state, num_heads=4, laplacian_heads=k, pool=pool)
  model = vit_lib.ViT(num_classes=fields["num_classes"], patch_size=8, hidden_dim=64, depth=2,
                      num_heads=4, mlp_dim=fields["mlp_dim"], laplacian_heads=k,
                      qk_norm=fields["qk_norm"], layerscale_init=fields["layerscale_init"],
                      pool=fields["pool"])
  params = export.unflatten(flat)
  x = np.random.RandomState(0).randn(2, 32, 32, 3).astype(np.float32)
  logits, aux = model.apply({"params": params}, x, return_tokens=True)
  blocks = []
  for b in tm.blocks:
    b.register_forward_hook(lambda m, i, o: blocks.append(o.detach().numpy()))
  with torch.no_grad():
    ref = tm(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()
  assert rel(logits, ref) < TOL
  for i, out in enumerate(blocks):  # (B, 1 + N, E), class token first, in both
    assert rel(aux["tokens"][i + 1], out) < TOL, f"block {i}"
  # laplax -> timm (a fresh timm model from the written kwargs, strict load) -> laplax
  back, kwargs = vit_convert.to_timm(flat, model)
  assert kwargs.pop("num_vanilla_heads", 4) == 4 - k
  fresh = timm_vit(k, **kwargs)
  fresh.load_state_dict({n: torch.from_numpy(v) for n, v in back.items()}, strict=True)
  _, again = vit_convert.from_timm(numpy_state(fresh), num_heads=4, laplacian_heads=k,
                                   pool=pool)
  assert again.keys() == flat.keys()
  for key in flat:
    assert np.array_equal(again[key], flat[key]), key
  if kw["no_embed_class"]:  # no folding: timm's own state comes back bit-exact too
    assert all(np.array_equal(back[n], state[n]) for n in state)


def test_vit_refuses_what_it_cannot_express():
  tm = timm_vit(0, reg_tokens=2, no_embed_class=True)
  with pytest.raises(ValueError, match="register tokens"):
    vit_convert.from_timm(numpy_state(tm), num_heads=4)
  tm = timm_vit(0, global_pool="avg")  # fc_norm by default: a norm after pooling
  with pytest.raises(ValueError, match="fc_norm"):
    vit_convert.from_timm(numpy_state(tm), num_heads=4, pool="gap")
  assert vit_convert.parse_arch("deit3_small_5L_patch16_224") == {
      "hidden_dim": 384, "num_heads": 6, "patch_size": 16, "image_size": 224,
      "laplacian_heads": 5}
  assert vit_convert.parse_arch("vit_small_patch16_224.dino")["laplacian_heads"] == 0


def test_timm_checkpoint_to_export_evaluates_and_goes_back(tmp_path, data_cache):
  """The authors' deit_mixed layout at configs/test.py:vit's size (28 px grey, patch 7, width
  32, 2 heads, both Laplacian): converted into an export of that run config, evaluated by
  eval.py's code, written back for timm, and loaded there strictly."""
  tm = randomise(timm_vit(2, img_size=28, patch_size=7, in_chans=1, num_classes=10,
                          embed_dim=32, num_heads=2, qk_norm=True, init_values=0.1,
                          no_embed_class=True), seed=5)
  torch.save({"state_dict": tm.state_dict(), "arch": "custom"}, tmp_path / "ckpt.pth.tar")
  config = make_config("vit", data_cache)
  manifest = convert.from_timm(tmp_path / "ckpt.pth.tar", tmp_path / "export", num_heads=2,
                               laplacian_heads=2, config=config)
  info = json.loads(manifest.read_text())
  assert info["heads"]["laplacian_heads"] == [[1, 1], [1, 1]]
  assert info["source"].endswith("ckpt.pth.tar") and info["input"]["image_shape"] == [28, 28, 1]
  run = offline.load(tmp_path / "export")
  x = np.random.RandomState(2).rand(3, 28, 28, 1).astype(np.float32)
  with torch.no_grad():
    expected = tm(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()
  assert rel(run.model.apply({"params": run.params}, x), expected) < TOL
  res = offline.evaluate_workdir(tmp_path / "export", tmp_path / "eval",
                                 offline.EvalOptions(evals=("val",)), log=lambda m: None)
  assert 0.0 <= res["val"]["accuracy"] <= 1.0 and res["step"] is None
  written = convert.to_torch(tmp_path / "export", tmp_path / "timm", "deit_mixed")
  kwargs = json.loads((tmp_path / "timm" / "timm_config.json").read_text())
  assert kwargs["num_vanilla_heads"] == 0
  state, _ = checkpoints.read_state(written[0])
  fresh = timm_vit(kwargs["num_heads"] - kwargs.pop("num_vanilla_heads"), **kwargs)
  fresh.load_state_dict({n: torch.from_numpy(v) for n, v in state.items()}, strict=True)
  assert all(torch.equal(fresh.state_dict()[n], p) for n, p in tm.state_dict().items())
  with pytest.raises(ValueError, match="use --to=deit_mixed"):
    convert.to_torch(tmp_path / "export", tmp_path / "timm2", "timm")


def test_dino_backbone_from_dinos_layout_and_back(tmp_path, data_cache):
  """DINO's vit_small layout (class position entry, no LayerScale, no QK-norm, no classifier)
  into configs/test.py:dino (28 px grey, patch 7, width 32, 2 heads): the teacher and student
  backbones are the converted weights, their class-token features are timm's, and --to=dino
  writes DINO's layout back (a zero class position entry), loaded strictly by timm."""
  tm = randomise(timm_vit(0, img_size=28, patch_size=7, in_chans=1, num_classes=0,
                          embed_dim=32, num_heads=2, qk_norm=False, init_values=None,
                          no_embed_class=False), seed=7)
  checkpoints.write_safetensors(tmp_path / "dino.safetensors", numpy_state(tm))
  convert.from_timm(tmp_path / "dino.safetensors", tmp_path / "export", num_heads=2,
                    task="dino", config=make_config("dino", data_cache))
  run = offline.load(tmp_path / "export")
  assert run.task.name == "dino" and sorted(run.extra) == ["centre", "teacher"]
  x = np.random.RandomState(3).rand(2, 28, 28, 1).astype(np.float32)
  with torch.no_grad():
    expected = tm(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()  # the normed class token
  for tree in (run.params, run.extra["teacher"]):
    _, features = run.model.apply({"params": tree}, x)
    assert rel(features, expected) < TOL
  written = convert.to_torch(tmp_path / "export", tmp_path / "back", "dino")
  kwargs = json.loads((tmp_path / "back" / "timm_config.json").read_text())
  assert kwargs["no_embed_class"] is False and kwargs["num_classes"] == 0
  state, _ = checkpoints.read_state(written[0])
  assert state["pos_embed"].shape == (1, 17, 32) and not state["pos_embed"][0, 0].any()
  fresh = timm_vit(0, **kwargs)
  fresh.load_state_dict({n: torch.from_numpy(v) for n, v in state.items()}, strict=True)
  with torch.no_grad():
    again = fresh(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()
  assert rel(again, expected) < TOL

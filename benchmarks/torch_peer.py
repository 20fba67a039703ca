"""A plain PyTorch ViT, the authors' way: the peer that laplax's CPU train step is timed against.

Same architecture as laplax.models.vit.ViT (DeiT-III style: conv patch embedding, learned
position table, class token without position, pre-norm blocks with LayerNorm QK-norm per head,
LayerScale, exact GELU MLP, final LayerNorm, linear head on the class token) and the same step:
smoothed cross-entropy, global-norm clipping, AdamW (decay on matrices only). Attention is the
fused `F.scaled_dot_product_attention`, then o = v - o on the Laplacian heads.

torch is an optional benchmark dependency, never a library one: import this module only after
checking `available()`.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np


def available() -> bool:
  return importlib.util.find_spec("torch") is not None


def build(*, image_size: int, channels: int, patch: int, width: int, depth: int, heads: int,
          mlp_dim: int, num_classes: int, laplacian_heads: int, layerscale_init: float = 0.1):
  """-> torch.nn.Module mapping images (B, C, H, W) to logits (B, num_classes)."""
  import torch
  from torch import nn
  import torch.nn.functional as F

  head_dim = width // heads
  lap = torch.zeros(heads, dtype=torch.bool)
  if laplacian_heads:
    lap[heads - laplacian_heads:] = True  # the last k heads, as laplax.heads.head_mask

  class Attention(nn.Module):

    def __init__(self):
      super().__init__()
      self.qkv = nn.Linear(width, 3 * width)
      self.q_norm, self.k_norm = nn.LayerNorm(head_dim), nn.LayerNorm(head_dim)
      self.out = nn.Linear(width, width)
      self.register_buffer("lap", lap.view(1, heads, 1, 1), persistent=False)
      self.any_lap = bool(lap.any())

    def forward(self, x):  # (B, T, E)
      b, t, _ = x.shape
      q, k, v = self.qkv(x).view(b, t, 3, heads, head_dim).permute(2, 0, 3, 1, 4)  # (B, H, T, D)
      o = F.scaled_dot_product_attention(self.q_norm(q), self.k_norm(k), v)
      if self.any_lap:
        o = torch.where(self.lap, v - o, o)  # Laplacian heads: (I - P) V
      return self.out(o.transpose(1, 2).reshape(b, t, width))

  class Block(nn.Module):

    def __init__(self):
      super().__init__()
      self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
      self.attn = Attention()
      self.mlp = nn.Sequential(nn.Linear(width, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, width))
      self.ls1 = nn.Parameter(torch.full((width,), layerscale_init))
      self.ls2 = nn.Parameter(torch.full((width,), layerscale_init))

    def forward(self, x):
      x = x + self.ls1 * self.attn(self.norm1(x))
      return x + self.ls2 * self.mlp(self.norm2(x))

  class ViT(nn.Module):

    def __init__(self):
      super().__init__()
      n = (image_size // patch) ** 2
      self.embed = nn.Conv2d(channels, width, patch, stride=patch)
      self.pos = nn.Parameter(torch.randn(1, n, width) * 0.02)
      self.cls = nn.Parameter(torch.zeros(1, 1, width))
      self.blocks = nn.Sequential(*[Block() for _ in range(depth)])
      self.norm = nn.LayerNorm(width)
      self.head = nn.Linear(width, num_classes)
      nn.init.zeros_(self.head.weight)

    def forward(self, images):
      x = self.embed(images).flatten(2).transpose(1, 2) + self.pos  # (B, N, E)
      x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
      return self.head(self.norm(self.blocks(x))[:, 0])

  return ViT()


class Trainer:
  """One model + AdamW; `step()` trains on a fixed batch (what a timing round runs)."""

  def __init__(self, *, images: np.ndarray, labels: np.ndarray, threads: int, lr: float = 2e-3,
               weight_decay: float = 0.05, clip_norm: float = 1.0, label_smoothing: float = 0.1,
               seed: int = 0, **model_kw):
    """images (B, H, W, C) float32 (laplax's layout; transposed here once), labels (B,) int."""
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    self.torch = torch
    self.model = build(image_size=images.shape[1], channels=images.shape[3], **model_kw)
    self.model.train()
    decay = [p for p in self.model.parameters() if p.ndim >= 2]
    no_decay = [p for p in self.model.parameters() if p.ndim < 2]
    # pos (1, N, E) and cls (1, 1, E) have ndim 3 but laplax does not decay them: move them.
    special = {id(self.model.pos), id(self.model.cls)}
    no_decay += [p for p in decay if id(p) in special]
    decay = [p for p in decay if id(p) not in special]
    self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                  {"params": no_decay, "weight_decay": 0.0}], lr=lr,
                                 betas=(0.9, 0.999))
    self.clip_norm, self.label_smoothing = clip_norm, label_smoothing
    self.images = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    self.labels = torch.from_numpy(labels.astype(np.int64))
    self.loss = float("nan")

  def step(self) -> None:
    torch = self.torch
    self.opt.zero_grad(set_to_none=True)
    logits = self.model(self.images)
    loss = torch.nn.functional.cross_entropy(logits, self.labels,
                                             label_smoothing=self.label_smoothing)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
    self.opt.step()
    self.loss = float(loss.detach())  # a host read per step, as laplax's loop reads metrics

  def num_params(self) -> int:
    return sum(p.numel() for p in self.model.parameters())


def _selftest() -> None:
  """Shapes and one finite step (python -m benchmarks.torch_peer)."""
  rng = np.random.default_rng(0)
  t = Trainer(images=rng.standard_normal((8, 28, 28, 1)).astype(np.float32),
              labels=rng.integers(0, 10, 8), threads=1, patch=7, width=32, depth=2, heads=2,
              mlp_dim=64, num_classes=10, laplacian_heads=2)
  t.step()
  assert math.isfinite(t.loss), t.loss
  print(f"ok: {t.num_params()} parameters, loss {t.loss:.4f}")


if __name__ == "__main__":
  if not available():
    print("torch is not installed: `pip install torch` to run the PyTorch peer")
  else:
    _selftest()

"""DINO's multi-crop settings: the `multicrop` config section as a frozen dataclass.

The views themselves are cut per record on the host, for in-memory and streamed data alike
(laplax.data.dino_stream: DINO's recipe, main_dino.py DataAugmentationDINO, in the ops of
laplax.data.ops): random resized crop -> flip -> colour jitter -> greyscale -> Gaussian blur
(global crop 1: p = 1.0, crop 2: p = 0.1, local crops: p = 0.5) -> solarise (global crop 2).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from laplax import sections


@dataclasses.dataclass(frozen=True)
class MultiCropConfig:
  """The views laplax.data.dino_stream cuts. Sizes in pixels; probabilities in [0, 1]. The
  defaults are laplax.sections.MULTICROP's, DINO's (224 px global crops); configs/common.py's
  dino_sections fills the config's multicrop section from that table, so a run's config.json
  holds every field."""

  global_size: int
  local_size: int
  num_local: int = sections.MULTICROP["num_local"]
  global_scale: tuple[float, float] = sections.MULTICROP["global_scale"]
  local_scale: tuple[float, float] = sections.MULTICROP["local_scale"]
  ratio: tuple[float, float] = sections.MULTICROP["ratio"]
  flip_prob: float = sections.MULTICROP["flip_prob"]
  jitter_prob: float = sections.MULTICROP["jitter_prob"]
  brightness: float = sections.MULTICROP["brightness"]
  contrast: float = sections.MULTICROP["contrast"]
  saturation: float = sections.MULTICROP["saturation"]
  hue: float = sections.MULTICROP["hue"]  # DINO's is 0.1
  grey_prob: float = sections.MULTICROP["grey_prob"]
  blur_sigma: tuple[float, float] = sections.MULTICROP["blur_sigma"]
  global_blur_probs: tuple[float, float] = sections.MULTICROP["global_blur_probs"]
  local_blur_prob: float = sections.MULTICROP["local_blur_prob"]
  solarize_prob: float = sections.MULTICROP["solarize_prob"]  # second global crop only
  solarize_threshold: float = sections.MULTICROP["solarize_threshold"]

  def __post_init__(self):
    """The rules across fields; each field's own range is laplax.train.ranges' (multicrop.*),
    checked with the config before anything is built."""
    for name in ("global_scale", "local_scale", "ratio", "blur_sigma"):
      lo, hi = getattr(self, name)
      if not lo <= hi:
        raise ValueError(f"multicrop.{name}={(lo, hi)} must satisfy low <= high")
    if len(self.global_blur_probs) != 2:
      raise ValueError(f"multicrop.global_blur_probs={self.global_blur_probs} needs one value "
                       "per global crop (2)")

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "MultiCropConfig":
    """From a config section (lists become tuples); unknown keys are an error."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - fields
    if unknown:
      raise ValueError(f"unknown multicrop settings {sorted(unknown)}; known: {sorted(fields)}")
    return cls(**{k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in d.items()})

"""benchmarks/torch_gpt_peer.py's PyTorch nanochat GPT computes laplax's GPT: on the same weights
(copied laplax -> torch) the forward loss agrees to float32 rounding for k = 0 and k = 2, and
so do the losses of a few AdamW steps; the benchmark's parity check refuses a mismatch. What
keeps the benchmark's tokens/s a comparison of one computation. No timing is asserted here."""

import numpy as np
import pytest

from unit.test_convert import _require

torch = _require("torch")

from benchmarks import torch_gpt_peer as peer  # noqa: E402

SHAPE = dict(depth=2, width=64, head_dim=16)  # 4 heads
VOCAB = 256


def setup(k: int):
  config = peer.laplax_config(vocab_size=VOCAB, laplacian_heads=k, **SHAPE)
  flat = peer.initial_params(config, seed=0)
  tokens = peer.batch(batch_size=2, seq_len=32, vocab_size=VOCAB, seed=0)
  trainer = peer.TorchTrainer(flat=flat, tokens=tokens, laplacian_heads=k, threads=1, **SHAPE)
  return config, flat, tokens, trainer


def test_forward_loss_matches_laplax_and_sees_the_heads():
  losses = {}
  for k in (0, 2):
    config, flat, tokens, trainer = setup(k)
    losses[k] = peer.laplax_loss(config, flat, tokens)
    assert trainer.forward_loss() == pytest.approx(losses[k], rel=peer.FIRST_LOSS_RTOL), k
  # the shared weights make the Laplacian heads visible in the loss, far above the tolerance
  assert abs(losses[2] - losses[0]) > 100 * peer.FIRST_LOSS_RTOL * losses[0]


def test_train_steps_match_and_the_check_refuses_a_mismatch():
  config, flat, tokens, trainer = setup(2)
  ours = peer.LaplaxTrainer(config=config, flat=flat, tokens=tokens)
  losses = {"laplax k=2": [ours.step() for _ in range(3)],
            "torch k=2": [trainer.step() for _ in range(3)]}
  assert losses["laplax k=2"][2] < losses["laplax k=2"][0]  # it trains
  parity = peer.check_parity(losses, [2])
  assert parity["k=2 first"] < peer.FIRST_LOSS_RTOL and parity["k=2 later"] < peer.LATER_LOSS_RTOL
  losses["torch k=2"][1] *= 1 + 10 * peer.LATER_LOSS_RTOL
  with pytest.raises(RuntimeError, match="warm-up step 2"):
    peer.check_parity(losses, [2])


def test_state_dict_has_nanochat_names_and_shapes():
  config = peer.laplax_config(vocab_size=VOCAB, laplacian_heads=0, **SHAPE)
  state = peer.torch_state(peer.initial_params(config, seed=0), SHAPE["depth"],
                           SHAPE["head_dim"])
  e = SHAPE["width"]
  assert state["transformer.wte.weight"].shape == (VOCAB, e)
  assert state["lm_head.weight"].shape == (VOCAB, e)
  assert state["transformer.h.1.attn.c_q.weight"].shape == (e, e)
  assert state["transformer.h.1.attn.c_proj.weight"].shape == (e, e)
  assert state["transformer.h.1.mlp.c_fc.weight"].shape == (4 * e, e)
  assert state["transformer.h.1.mlp.c_proj.weight"].shape == (e, 4 * e)
  assert all(v.dtype == np.float32 for v in state.values())

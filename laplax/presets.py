"""Config sections every experiment shares, defined once; experiments state their differences.

The repository's configs (configs/*.py) import this module as `from configs import common`
(configs/common.py re-exports it); a config written outside the repository, and
laplax.convert's default run configs, import it from the package: `from laplax import presets`.

  run(name, task)        name, task, seed, steps, logging, checkpoint, mesh, axis rules
  laplacian_heads(k)     the head-spec field: an int k or a per-layer list from the command line
  image_data(name)       an image-classification data set (TFDS, cached) and its batches
  streamed_image_data(tfds_name)  a prepared TFDS data set (or parquet shards) streamed per
                                  record (ImageNet)
  vit(preset)            a DeiT-III-style ViT
  adamw(lr)              optim.name 'adamw' on the 'cosine' schedule (warm-up, cosine), clipping
  classification_loss()  the loss section: loss, label smoothing, mixup / cutmix (off)
  lm_loss()              the lm / chat loss section (chunked cross-entropy)
  evaluator(type)        one config.evals section (laplax.train.evaluator); *_evals(): a task's
  deit3(c)               DeiT-III's training recipe applied to a classification config
  text_data(), gpt(), lm_optim(), muon()   the lm task's data, model and optimiser sections
  dino_sections(c, ...)  DINO's head, multicrop (every MultiCropConfig field) and dino sections
  study(base, specs)     a baseline-vs-Laplacian grid of `base` runs
"""

import copy
import dataclasses

import ml_collections

from laplax import sections
from laplax.data import multicrop as multicrop_lib
from laplax.data.shared import shared_data_dir
from laplax.models import gpt as gpt_lib
from laplax.train import evaluator as evaluator_lib

SHARED = shared_data_dir()  # $LAPLAX_SHARED_DATA, else ../shared/data next to the repository


def laplacian_heads(default=0) -> ml_collections.FieldReference:
  """The head spec (laplax.heads): k (the last k heads of every layer), an operator for every
  head, or a per-layer list / per-head entries.

  field_type=object lets the flag parse any: --config.model.laplacian_heads=4,
  ='(0,0,4,4)' (a list per layer), ='[[0,1],[1,1]]', ='heat(2)', ='mix(laplacian)' or
  ="(0, ('attention', 'mix', 'heat(2)', 'laplacian'))"."""
  return ml_collections.FieldReference(default, field_type=sections.LAPLACIAN_HEADS.type)


def run(name: str, task: str, *, total_steps: int = sections.RUN["total_steps"],
        log_every: int = sections.RUN["log_every"],
        every_steps: int = sections.RUN["checkpoint"]["every_steps"]
        ) -> ml_collections.ConfigDict:
  """The sections of any run: what trains, for how long, where it checkpoints, on which mesh:
  every key of laplax.sections.RUN (where each is explained) at its default, these set."""
  c = sections.build(sections.RUN, "run", name=name, task=task, total_steps=total_steps,
                     log_every=log_every)
  c.checkpoint.every_steps = every_steps
  return c


def evaluator(type_: str, **keys) -> ml_collections.ConfigDict:
  """A config.evals section with every key of the evaluator as a field, at its default
  (`every`, `at_init`, `final`, `analysis` and the class's own; laplax.train.evaluator), except
  `keys`: so --config.evals.NAME.KEY=V sets any of them from the command line."""
  # building a section imports the evaluator's module to read its defaults
  return evaluator_lib.section(type_, **keys)


def classification_evals(*, every: int = 0, test: bool = True) -> ml_collections.ConfigDict:
  """Val accuracy (every `every` steps and at the end), test accuracy at the end (`test`), and
  for eval.py --analyze the per-layer geometry, the mechanism measurements and the attention
  maps."""
  e = ml_collections.ConfigDict({"val": evaluator("accuracy", split="val", every=every)})
  if test:
    e.test = evaluator("accuracy", split="test")
  split = "test" if test else "val"
  e.geometry = evaluator("vit_geometry", split=split, final=False, analysis=True)
  e.mechanism = evaluator("mechanism", split=split, final=False, analysis=True)
  e.attention = evaluator("attention_maps", split=split, final=False, analysis=True)
  return e


def lm_evals(*, every: int) -> ml_collections.ConfigDict:
  """Validation loss and bits per byte every `every` steps and at the end; benchmark tasks, the
  geometry and the mechanism measurements for eval.py (--set=lm_tasks.tasks=..., --analyze)."""
  return ml_collections.ConfigDict({
      "val": evaluator("bpb", every=every),
      "lm_tasks": evaluator("lm_tasks", final=False),
      "geometry": evaluator("lm_geometry", final=False, analysis=True),
      # nanochat's CORE over the DCLM bundle: --set=core.bundle=DIR (python -m
      # laplax.data.fetch core writes one)
      "core": evaluator("core", final=False),
      "mechanism": evaluator("mechanism", final=False, analysis=True, examples=256,
                             batch_size=8)})


def image_data(name: str, *, task: str = "classification", **keys) -> ml_collections.ConfigDict:
  """`task`'s section of an image data set held in memory: every key of laplax.sections'
  table (where each is explained) at its default, `keys` set. The classifier's training
  augmentation, `augment`, is a sequence of ops (laplax.data.ops): 'pad_crop(4)' (random crop of
  the image padded by 4; 'pad_crop(4,reflect)': DeiT-III's simple random crop), 'rrc(0.08,1)'
  (random-resized crop), 'flip', 'three_augment', 'color_jitter(0.3)', run per image by the
  one pipeline (laplax.data.streaming, over the arrays); () for none."""
  return sections.build(sections.TABLES[task, False], name=name, **keys)


def streamed_image_data(tfds_name: str, *, task: str = "classification", **keys
                        ) -> ml_collections.ConfigDict:
  """`task`'s section of a prepared TFDS data set read per record (laplax.data.streaming):
  decoded, cropped and augmented in grain workers (as in-memory arrays are), sent to the device
  as uint8. Every key of laplax.sections' table at its default, `keys` set. The classifier's
  `augment` starts with a crop of the decoded record to image_size ('rrc(0.08,1)': RandomResizedCrop;
  'pad_crop(4,reflect)': DeiT-III's resize, pad 4, crop), then per-record ops ('flip',
  'three_augment', 'color_jitter(0.3)')."""
  return sections.build(sections.TABLES[task, True], name=tfds_name, tfds_name=tfds_name, **keys)


def vit(preset: str, patch_size: int, **overrides) -> ml_collections.ConfigDict:
  """A ViT (laplax.models.vit): every key of laplax.sections.VIT (where each is explained) at
  its default, a preset (laplax.models.vit.PRESETS) and its LayerScale (sections.VIT_LAYERSCALE:
  DeiT-III's 1e-6 for S/B/L), plus explicit overrides (also the preset's hidden_dim, depth,
  num_heads, mlp_dim)."""
  m = sections.build(sections.VIT, "model", preset=preset, patch_size=patch_size,
                     layerscale_init=sections.VIT_LAYERSCALE.get(
                         preset, sections.VIT["layerscale_init"]))
  m.update(overrides)
  return m


def adamw(lr: float, *, warmup_steps: int, **keys) -> ml_collections.ConfigDict:
  """AdamW (laplax.train.optim OPTIMIZERS) on a linear warm-up + cosine learning rate: every key
  of laplax.sections.OPTIM (where each is explained) at its default, those of
  sections.ADAMW (the recipe's weight decay and final lr) over them, these set."""
  return optim_section(**{**sections.ADAMW, "lr": lr, "warmup_steps": warmup_steps, **keys})


def optim_section(**keys) -> ml_collections.ConfigDict:
  """An optim section: every key of laplax.sections.OPTIM at its default, `keys` set (a key it
  lacks is refused); None defaults typed float, so the command line can set them."""
  o = sections.build(sections.OPTIM, "optim", **keys)
  for key, default in sections.OPTIM.items():
    if default is None and o[key] is None:  # OPTIM's None keys are all numbers when set
      o[key] = ml_collections.FieldReference(None, field_type=float)
  return o


def muon() -> ml_collections.ConfigDict:
  """optim.muon: nanochat's optimiser (optim.name='muon'), values from
  github.com/karpathy/nanochat commit ae0bf52 (2026-01-05, "tune hyperparameters based on
  overnight sweeps"): scripts/base_train.py (matrix_lr, embedding_lr 0.3 (0.2 before that
  commit), unembedding_lr, weight decay 0, warmdown_ratio 0.4, get_muon_momentum),
  nanochat/gpt.py setup_optimizers (AdamW betas and eps, dmodel_lr_scale), nanochat/muon.py
  (Nesterov, 5 Newton-Schulz steps, the fan ratio).

  Muon (lr matrix_lr, Nesterov momentum, 5 Newton-Schulz steps) on every hidden matrix
  (attention q/k/v/out, MLP); AdamW (betas adam_b1/adam_b2, eps adam_eps, optim.weight_decay)
  on the embedding (embedding_lr), the unembedding (unembedding_lr) and vectors / scalars
  (scalar_lr: our choice, nanochat's first GPT has none). The AdamW lrs are scaled by
  (width / width_reference) ** -0.5 (nanochat's dmodel_lr_scale, tuned at width 768). Muon's
  momentum goes linearly from momentum_start to momentum over momentum_warmup_steps
  (get_muon_momentum). Every lr follows optim's warm-up / warm-down shape; nanochat's is no
  warm-up, a linear warm-down to 0 over the last 40 % of the steps, global-norm clipping at 1
  (set in configs/pod/gpt_d20.py; the CPU configs keep their own shape). distributed: each
  device runs Newton-Schulz on its share of the matrices only (nanochat's DistMuon; off here,
  on in the pod configs; the same update either way).
  """
  return sections.build(sections.MUON, "optim.muon")


def text_data(*, sources, vocab_size: int = 2048, seq_len: int = 256, batch_size: int = 16,
              eval_batch_size: int = 32) -> ml_collections.ConfigDict:
  """A text corpus for the lm task: files, directories (recursive), globs, JSONL or parquet,
  tokenised once by a BPE of `vocab_size` (laplax.data.text), in windows of seq_len + 1; every
  key of laplax.sections.TEXT (where each is explained) at its default, these set."""
  return sections.build(sections.TEXT, sources=tuple(sources), vocab_size=vocab_size,
                        seq_len=seq_len, batch_size=batch_size, eval_batch_size=eval_batch_size)


def chat_data(*, rows: str, train: dict, val: dict, seq_len: int, batch_size: int,
              eval_batch_size: int, vocab_size: int) -> ml_collections.ConfigDict:
  """Conversation mixtures for the chat task (laplax.tasks.chat): data.train / data.val are
  {name: {kind, path, split, start, size, weight}} (kinds: laplax.data.chat_tasks.KINDS),
  rendered by the pretraining run's tokenizer into packed windows or padded rows; every key of
  laplax.sections.CHAT at its default, these set."""
  return sections.build(sections.CHAT, rows=rows, train=ml_collections.ConfigDict(train),
                        val=ml_collections.ConfigDict(val), seq_len=seq_len,
                        batch_size=batch_size, eval_batch_size=eval_batch_size,
                        vocab_size=vocab_size)


def chat_stage(base: ml_collections.ConfigDict, name: str, *, data: ml_collections.ConfigDict,
               lr_scale: float, warmdown_fraction: float) -> ml_collections.ConfigDict:
  """A chat fine-tuning stage of the lm run `base` (its model and optimiser; set init_from to
  that run's workdir): a fresh schedule without warm-up at lr_scale of every base lr, held,
  then a linear warm-down to 0 over the last warmdown_fraction of the steps (nanochat's
  mid-training: 1.0 and 0.2; its SFT: 0.02 and 1.0, a linear decay from the start)."""
  c = run(name, "chat", total_steps=0, log_every=base.log_every,
          every_steps=base.checkpoint.every_steps)
  c.mesh = ml_collections.ConfigDict(base.mesh.to_dict())
  c.axis_rules = base.axis_rules
  c.model = copy.deepcopy(base.model)  # keeps laplacian_heads' object-typed field
  c.loss = copy.deepcopy(base.loss)
  c.data = data
  c.optim = copy.deepcopy(base.optim)
  c.optim.schedule = "warmdown"
  c.optim.warmup_steps = 0
  c.optim.warmdown_fraction = warmdown_fraction
  c.optim.final_lr_fraction = 0.0
  c.optim.lr_scale = lr_scale
  c.evals = ml_collections.ConfigDict({"val": evaluator("bpb", every=0)})
  return c


def gpt(*, depth: int = sections.GPT_CPU["depth"], width: int = sections.GPT_CPU["width"],
        head_dim: int = sections.GPT_CPU["head_dim"], init: str = sections.GPT["init"]
        ) -> ml_collections.ConfigDict:
  """A nanochat-style GPT (laplax.models.gpt): every key of laplax.sections.GPT (GPTConfig's
  defaults) (the switches are documented there: num_kv_heads, mlp_ratio, rope_theta,
  logit_softcap, attention_impl, remat_policy, scan_layers, dtype, param_dtype) but vocab_size
  (the tokenizer's, padded to a multiple of vocab_multiple), with this shape (width 0 = 64 x
  depth; width / head_dim heads) and init: 'glorot' (the CPU configs, so earlier CPU numbers
  stay comparable) or 'nanochat' (nanochat's MLP init at ae0bf52; configs/pod/gpt_d20.py)."""
  return sections.build(sections.GPT, "model", depth=depth, width=width, head_dim=head_dim,
                        init=init)


def _on_pod(m: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A GPT model section as the pod configs run it: bf16 compute over float32 parameters,
  splash attention, scanned blocks with full remat."""
  m.attention_impl = "splash"
  m.dtype = "bfloat16"
  m.param_dtype = "float32"
  m.scan_layers = True
  m.remat_policy = "full"
  return m


def gpt_d20_model() -> ml_collections.ConfigDict:
  """nanochat's depth-20 GPT on a pod (configs/pod/gpt_d20.py and its chat stages): 10 heads of
  128, k = 5, nanochat's init (nanochat/gpt.py at ae0bf52: MLP c_fc uniform +-sqrt(3 / 1280)),
  bf16 compute, splash attention, scanned blocks with full remat (its loss: lm_loss(chunk=256))."""
  m = gpt(depth=20, width=1280, head_dim=128, init="nanochat")
  m.laplacian_heads = laplacian_heads(5)
  return _on_pod(m)


def gpt_d20_optim(*, warmdown_fraction: float) -> ml_collections.ConfigDict:
  """nanochat's optimiser for d20 (optim.muon, distributed over the chips): no warm-up, a
  linear warm-down to 0 over the last `warmdown_fraction`, global-norm clipping at 1."""
  o = lm_optim()
  o.name = "muon"
  o.schedule = "warmdown"
  o.warmup_steps = 0
  o.warmdown_fraction = warmdown_fraction
  o.final_lr_fraction = 0.0
  o.clip_norm = 1.0
  # Newton-Schulz on each chip's share of the matrices (laplax.train.optim.muon.scale_by_muon)
  o.muon.distributed = True
  return o


def gpt_d20_stage_base(*, log_every: int, every_steps: int) -> ml_collections.ConfigDict:
  """What d20's chat stages (configs/pod/gpt_d20_mid.py, _sft.py) take from the pretraining
  run: its mesh, model and optimiser, with the embedding lr of nanochat's mid_train.py and
  chat_sft.py at ae0bf52 (0.2; base_train.py's became 0.3 at that commit)."""
  base = run("gpt_d20", "lm", log_every=log_every, every_steps=every_steps)
  base.mesh.update({"data": 1, "fsdp": -1, "model": 1})
  base.model = gpt_d20_model()
  base.loss = lm_loss(chunk=256)
  base.optim = gpt_d20_optim(warmdown_fraction=0.0)  # each stage sets its own schedule
  base.optim.muon.embedding_lr = 0.2
  return base


FORK_COMMIT = "1f70b557"  # yuchongzhang/nanochat: the newest commit with the six parts


def gpt_fork_model(depth: int) -> ml_collections.ConfigDict:
  """The authors' default model at `depth` (laplax.models.gpt.fork_default: width
  ceil(64 depth / 128) x 128, heads of 128, every part, windows 'SSSL', rotary base 100000, q/k
  scale 1.2, the fork's init, k = 0: --config.model.laplacian_heads=k); bf16 compute, splash
  attention, scanned blocks with full remat. model.sequence_len is set by the caller (the
  windows derive from the training context)."""
  fork = dataclasses.asdict(gpt_lib.fork_default(depth))
  m = gpt(depth=depth, width=fork["width"], head_dim=fork["head_dim"], init="fork")
  m.update({k: v for k, v in fork.items()
            if k not in ("vocab_size", "laplacian_heads", "attention_impl", "sequence_len")})
  return _on_pod(m)


def nanochat_optim(*, target_param_data_ratio: float = 12.0) -> ml_collections.ConfigDict:
  """The fork's base_train optimiser and schedule (optim.name 'nanochat', laplax.train.optim
  .nanochat; the values and their sources in laplax.sections.NANOCHAT): lr multiplier warm-up
  over 40 steps, constant, warm-down over the last 65 % to 0.05, no clipping; the horizon, the
  batch (data.batch_size -1) and the lr / weight-decay transfer from the d12 reference at
  `target_param_data_ratio` (0: as set)."""
  o = lm_optim()
  o.name = "nanochat"
  o.schedule = "warmdown"
  o.warmup_steps = 40
  o.warmdown_fraction = 0.65
  o.final_lr_fraction = 0.05
  o.clip_norm = 0.0
  o.nanochat.target_param_data_ratio = target_param_data_ratio
  # Polar Express on each chip's share of the matrices (laplax.train.optim.nanochat)
  o.nanochat.distributed = True
  return o


def gpt_fork(depth: int) -> ml_collections.ConfigDict:
  """The authors' pretraining run at `depth` as runs/laplacian_sweep.sh runs it
  (configs/pod/gpt_fork_d*.py): their default model, vocabulary 32768 (tok_train's), context
  2048, the recipe's horizon and batch at 12 tokens per scaling parameter, validation bpb every
  250 steps; FSDP over every chip of a TPU pod."""
  c = run(f"gpt_fork_d{depth}", "lm", total_steps=0, log_every=50, every_steps=1000)
  c.platform = "tpu"  # refused on another backend (laplax.train.platform)
  c.evals = lm_evals(every=250)
  # the sweep's CORE: every example of every task (--core-metric-max-per-task=-1) at the end,
  # once --config.evals.core.bundle names the bundle and --config.evals.core.final=True
  c.evals.core.max_per_task = -1
  c.evals.core.batch_size = 256
  c.mesh.update({"data": 1, "fsdp": -1, "model": 1})  # keeps mesh.dcn_*
  # sources: the FineWeb-Edu / ClimbMix parquet shards (python -m laplax.data.fetch); batch -1:
  # the recipe's (Power Lines) batch in sequences of seq_len
  c.data = text_data(sources=(), vocab_size=32_768, seq_len=2048, batch_size=-1,
                     eval_batch_size=256)
  c.data.tokenizer_train_chars = 2_000_000_000  # tok_train: ~2B characters
  c.data.eval_windows = 4096
  c.model = gpt_fork_model(depth)
  c.model.sequence_len = c.data.get_ref("seq_len")  # the windows follow --config.data.seq_len
  c.loss = lm_loss(chunk=256)
  c.optim = nanochat_optim()
  return c


def lm_optim() -> ml_collections.ConfigDict:
  """The lm task's optimiser section: AdamW with parameter groups on nanochat's warm-up /
  constant / warm-down schedule, and Muon's settings for optim.name='muon'."""
  # optim.name 'adamw' (with the parameter groups below) or 'muon' (optim.muon)
  return optim_section(
      schedule="warmdown",  # nanochat's: warm-up, constant, linear warm-down
      lr=3e-3,  # AdamW's peak lr (unused by 'muon')
      embed_lr_scale=10.0, unembed_lr_scale=1.0,  # AdamW's groups: embedding, lm_head
      warmup_steps=30, warmdown_fraction=0.3, final_lr_fraction=0.0, weight_decay=0.0,
      b1=0.9, b2=0.95, clip_norm=1.0)


def dino_sections(c: ml_collections.ConfigDict, *,
                  out_dim: int = sections.DINO_HEAD["out_dim"],
                  hidden_dim: int = sections.DINO_HEAD["hidden_dim"],
                  bottleneck_dim: int = sections.DINO_HEAD["bottleneck_dim"],
                  warmup_teacher_temp_epochs=sections.DINO["warmup_teacher_temp_epochs"],
                  freeze_last_layer_epochs=sections.DINO["freeze_last_layer_epochs"],
                  **multicrop) -> ml_collections.ConfigDict:
  """DINO's head, multicrop and dino sections on c (the dino task; laplax.tasks.dino), with
  DINO's optimiser: AdamW at `c.optim`'s lr with weight decay on a cosine 0.04 -> 0.4 and each
  parameter's gradient clipped to norm 3.0. The head defaults are CPU-sized (laplax.sections
  .DINO_HEAD); the temperatures and momenta are DINO's (sections.DINO). The multicrop
  section holds every field of laplax.data.multicrop.MultiCropConfig (sections.MULTICROP:
  DINO's 224 px recipe: 6 local crops, blur sigma (0.1, 2.0) px), set by `multicrop` (global_size and local_size at least)."""
  c.head = sections.build(sections.DINO_HEAD, "head", out_dim=out_dim, hidden_dim=hidden_dim,
                          bottleneck_dim=bottleneck_dim)
  c.multicrop = sections.build(sections.MULTICROP, "multicrop", **multicrop)
  unset = [k for k in ("global_size", "local_size") if c.multicrop[k] is None]
  if unset:
    raise TypeError(f"dino_sections needs multicrop's {' and '.join(unset)}")
  multicrop_lib.MultiCropConfig.from_dict(c.multicrop.to_dict())  # its rules, checked now
  c.dino = sections.build(sections.DINO, "dino",
                          warmup_teacher_temp_epochs=warmup_teacher_temp_epochs,
                          freeze_last_layer_epochs=freeze_last_layer_epochs)
  return c


def dino_optim(lr: float, *, warmup_steps: int) -> ml_collections.ConfigDict:
  """DINO's AdamW: weight decay on a cosine 0.04 -> 0.4, each parameter's gradient clipped to
  norm 3.0 (main_dino.py's clip_gradients)."""
  o = adamw(lr, warmup_steps=warmup_steps, weight_decay=0.04, clip_norm=3.0)
  o.weight_decay_end = 0.4
  o.clip_mode = "per_tensor"
  return o


def classification_loss(*, label_smoothing: float = sections.CLASSIFICATION_LOSS[
    "label_smoothing"]) -> ml_collections.ConfigDict:
  """The classification task's loss section: softmax cross-entropy, no mixing. Its targets
  (label smoothing, Mixup / CutMix: every field of laplax.data.mixup.MixupConfig: laplax.sections
  .MIXUP, off) are part of it."""
  return sections.build(sections.CLASSIFICATION_LOSS, "loss", label_smoothing=label_smoothing)


def lm_loss(*, chunk: int = sections.LM_LOSS["chunk"]) -> ml_collections.ConfigDict:
  """The lm and chat tasks' loss section: next-token cross-entropy, in sequence chunks of
  `chunk` tokens when > 0 (the float32 (B, T, V) logits never exist; gpt.chunked_cross_entropy)."""
  return sections.build(sections.LM_LOSS, "loss", chunk=chunk)


def deit3(c: ml_collections.ConfigDict, *, crop: str = "rrc") -> ml_collections.ConfigDict:
  """DeiT-III's recipe (Touvron et al. 2022, their ImageNet-1k command) on a classification
  config: crop + flip ('rrc': random-resized crop; 'src': simple random crop, reflect padding),
  3-Augment, colour jitter 0.3, Mixup 0.8 / CutMix 1.0 switched with p 0.5, BCE on binarised
  mixed targets without label smoothing, trunc_normal(0.02) initialisation. LayerScale (1e-6
  for S/B/L), drop-path, optimiser and schedule stay the config's (DeiT-III: LAMB, no clipping,
  repeated augmentation; laplax keeps AdamW and does not repeat examples)."""
  if crop not in ("rrc", "src"):
    raise ValueError(f"crop={crop!r}; use 'rrc' or 'src'")
  # The same ops in memory and streamed (laplax.data.ops); bicubic: DeiT-III's
  # --train-interpolation.
  c.data.augment = ("rrc(0.08,1,interp=bicubic)" if crop == "rrc" else "pad_crop(4,reflect)",
                    "flip", "three_augment", "color_jitter(0.3)")
  c.loss = classification_loss(label_smoothing=0.0)
  c.loss.name = "sigmoid_xent"
  c.loss.bce_binary_targets = True
  c.loss.mixup.mixup_alpha = 0.8
  c.loss.mixup.cutmix_alpha = 1.0
  c.model.weight_init = "trunc_normal"
  return c


def on_gpu_node(c: ml_collections.ConfigDict, *, gpus: int = 8) -> ml_collections.ConfigDict:
  """A pod run config (configs/pod/) as one node of `gpus` GPUs runs it (configs/gpu/): platform
  'gpu', cuDNN's flash attention in place of splash (bf16 compute), the same global batch
  (data.batch_size / gpus per GPU) and the pod's FSDP mesh over every GPU of every node; the
  recipe unchanged, so results compare with the pod's."""
  if c.data.batch_size % gpus:
    raise ValueError(f"data.batch_size={c.data.batch_size} does not split over {gpus} GPUs")
  c.platform = "gpu"
  c.model.attention_impl = "cudnn"
  return c


def study(name: str, base: ml_collections.ConfigDict, specs, seeds=(0, 1, 2)
          ) -> ml_collections.ConfigDict:
  """A study of `base` runs: specs (the baseline first) x seeds, one report (laplax.study)."""
  c = ml_collections.ConfigDict()
  c.name = name
  c.base = base
  c.study = ml_collections.ConfigDict()
  # the first entry is the baseline of the paired test; object: the command line may set it,
  # e.g. --config.study.laplacian_heads="(0, 2, (0, 0, 4, 4))"
  c.study.laplacian_heads = ml_collections.FieldReference(list(specs), field_type=object)
  c.study.seeds = tuple(seeds)  # a tuple: --config.study.seeds="(0, 1)" sets it
  # Cells trained at once, each a one-core process (laplax.study.workers); 0: one per CPU core.
  c.study.workers = 1
  return c

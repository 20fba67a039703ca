"""Config sections every experiment shares, defined once; experiments state their differences.

  run(name, task)        name, task, seed, steps, logging, checkpoint, mesh, axis rules
  laplacian_heads(k)     the head-spec field: an int k or a per-layer list from the command line
  image_data(name)       an image-classification data set (TFDS, cached) and its batches
  streamed_image_data(tfds_name)  a prepared TFDS data set (or parquet shards) streamed per
                                  record (ImageNet)
  vit(preset)            a DeiT-III-style ViT
  adamw(lr)              optim.name 'adamw' on the 'cosine' schedule (warm-up, cosine), clipping
  classification_loss()  loss, mixup / cutmix (off by default) for the classification task
  evaluator(type)        one config.evals section (laplax.train.evaluator); *_evals(): a task's
  deit3(c)               DeiT-III's training recipe applied to a classification config
  text_data(), gpt(), lm_optim(), muon()   the lm task's data, model and optimiser sections
  dino_sections(c)       DINO's head, multicrop and dino sections
  study(base, specs)     a baseline-vs-Laplacian grid of `base` runs
"""

import copy

import ml_collections

from laplax.data.shared import shared_data_dir

SHARED = shared_data_dir()  # $LAPLAX_SHARED_DATA, else ../shared/data next to the repository


def laplacian_heads(default=0) -> ml_collections.FieldReference:
  """The head spec (laplax.heads): k (the last k heads of every layer), an operator for every
  head, or a per-layer list / per-head entries.

  field_type=object lets the flag parse any: --config.model.laplacian_heads=4,
  ='(0,0,4,4)' (a list per layer), ='[[0,1],[1,1]]', ='heat(2)', ='mix(laplacian)' or
  ="(0, ('attention', 'mix', 'heat(2)', 'laplacian'))"."""
  return ml_collections.FieldReference(default, field_type=object)


def run(name: str, task: str, *, total_steps: int = 0, log_every: int = 50,
        every_steps: int = 200) -> ml_collections.ConfigDict:
  """The sections of any run: what trains, for how long, where it checkpoints, on which mesh."""
  c = ml_collections.ConfigDict()
  c.name = name
  c.task = task
  c.seed = 0
  c.total_steps = total_steps  # > 0 overrides num_epochs where the task has epochs
  c.log_every = log_every
  # A run starting from another run's parameters (a fine-tuning stage): its workdir, and the
  # step to take (0: its latest good checkpoint); a fresh optimiser state and schedule.
  c.init_from = ""
  c.init_from_step = 0
  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = every_steps
  c.checkpoint.keep = 2
  # None: asynchronous saves on accelerators, synchronous on CPU.
  c.checkpoint.async_save = ml_collections.FieldReference(None, field_type=bool)
  c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "model": 1})
  c.axis_rules = ()  # overrides of laplax.sharding.DEFAULT_RULES, e.g. (("embed", None),)
  c.profile = ()  # (first step, number of steps): a jax.profiler trace in workdir/profile
  c.compilation_cache_dir = ""  # e.g. ~/.cache/laplax/xla or gs://...: reuse compiled steps
  c.lock_lease_s = 60.0  # gs:// workdirs: a killed run's lock is taken over after this long
  # 'tpu' / 'gpu': refuse to start on another backend (laplax.train.platform); None: any.
  c.platform = ml_collections.FieldReference(None, field_type=str)
  return c


def evaluator(type_: str, **keys) -> ml_collections.ConfigDict:
  """A config.evals section: its `type`, and what differs from the evaluator's defaults
  (`every`, `at_init`, `final`, `analysis` and its own keys; laplax.train.evaluator)."""
  return ml_collections.ConfigDict({"type": type_, **keys})


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
  geometry and the mechanism measurements for eval.py (--tasks, --analyze)."""
  return ml_collections.ConfigDict({
      "val": evaluator("bpb", every=every),
      "lm_tasks": evaluator("lm_tasks", final=False),
      "geometry": evaluator("lm_geometry", final=False, analysis=True),
      "mechanism": evaluator("mechanism", final=False, analysis=True, examples=256,
                             batch_size=8)})


def image_data(name: str, *, source_dir: str = "", batch_size: int = 128,
               eval_batch_size: int = 500, augment: tuple[str, ...] = ("pad_crop(4)",)
               ) -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.name = name
  d.source_dir = source_dir  # '' = the builder's default place
  d.cache_dir = ""  # '' = ~/.cache/laplax (prepared TFDS + decoded arrays)
  # True: every host sees cache_dir (NFS; checked at start). False: each host may have its own.
  d.shared_cache = False
  d.val_size = 5000  # held out of the training split
  d.split_seed = 0
  d.train_subset = 0  # > 0: first N training examples only (quick runs)
  d.eval_subset = 0  # > 0: first N val / test examples only
  # Training augmentation ops, in order (laplax.data.ops): 'pad_crop(4)' (random crop of the
  # image padded by 4; 'pad_crop(4,reflect)': DeiT-III's simple random crop), 'rrc(0.08,1)'
  # (random-resized crop back to the input size), 'flip', 'three_augment',
  # 'color_jitter(0.3)'; () for none.
  d.augment = tuple(augment)
  d.batch_size = batch_size  # global
  d.eval_batch_size = eval_batch_size
  return d


def streamed_image_data(tfds_name: str, *, tfds_data_dir: str = "", image_size: int = 224,
                        batch_size: int = 1024, eval_batch_size: int = 1024
                        ) -> ml_collections.ConfigDict:
  """A prepared TFDS image-classification data set read per record (laplax.data.streaming):
  decoded, cropped and augmented in grain workers, sent to the device as uint8."""
  d = ml_collections.ConfigDict()
  d.name = tfds_name
  d.tfds_name = tfds_name
  d.source = "tfds"  # 'tfds' (ArrayRecord in tfds_data_dir) | 'parquet' (parquet_files)
  d.tfds_data_dir = tfds_data_dir  # holds tfds_name/<version>/ (ArrayRecord); local or gs://
  # source='parquet': Hugging Face parquet shards, '{split}' standing for the split's name
  # (laplax.data.parquet_images), e.g. 'gs://BUCKET/imagenet-1k/data/{split}-*.parquet'.
  d.parquet_files = ""
  d.image_column = "image"  # a struct {bytes, path} (Hugging Face's Image) or binary
  d.label_column = "label"  # integers; classes: num_classes, else the files' ClassLabel
  d.train_split = "train"
  d.eval_split = "validation"  # periodic and final validation
  d.test_split = ""  # '' = none (ImageNet's test labels are not public)
  d.image_size = image_size  # training crop side
  d.num_classes = 0  # 0 = the data set's (set it to compile without data: --aot)
  d.num_train = 0  # 0 = the data set's (used without data: --aot)
  # Training augmentation ops (laplax.data.ops): first a crop of the decoded record to
  # image_size ('rrc(0.08,1)': RandomResizedCrop; 'pad_crop(4,reflect)': DeiT-III's resize, pad
  # 4, crop), then per-record ops ('flip', 'three_augment', 'color_jitter(0.3)').
  d.augment = ("rrc(0.08,1)", "flip")
  d.eval_resize = 0  # shorter side before the centre crop; 0 = int(eval_crop / eval_crop_pct)
  d.eval_crop_pct = 0.875  # DeiT's --eval-crop-ratio, timm's crop_pct (224 of 256)
  d.eval_crop = 0  # 0 = image_size
  d.mean = (0.485, 0.456, 0.406)  # ImageNet's, in [0, 1] pixel units
  d.std = (0.229, 0.224, 0.225)
  d.train_subset = 0  # > 0: first N training records only
  d.eval_subset = 0  # > 0: first N evaluation records only
  d.num_workers = 0  # grain worker processes decoding (0: in the trainer; -1: cores - 1)
  d.num_threads = 1  # reader threads (per worker)
  d.prefetch = 2  # batches made ahead (per worker)
  d.batch_size = batch_size  # global
  d.eval_batch_size = eval_batch_size
  return d


def vit(preset: str, patch_size: int, **overrides) -> ml_collections.ConfigDict:
  """A ViT (laplax.models.vit): a preset plus explicit overrides."""
  m = ml_collections.ConfigDict()
  m.name = "vit"
  m.preset = preset  # mu / tiny / small-cpu / Ti / S / B / L (laplax.models.vit.PRESETS)
  m.patch_size = patch_size
  m.laplacian_heads = laplacian_heads(0)
  m.qk_norm = True
  # DeiT-III's LayerScale 1e-6 (timm's deit3_*) for the standard sizes; the CPU presets use
  # 0.1, since 1e-6 barely moves in a few hundred steps.
  m.layerscale_init = 1e-6 if preset in ("S", "B", "L") else 0.1
  m.drop_path_rate = 0.0
  m.pool = "cls"
  m.scan_layers = False  # nn.scan over blocks, the head table as a scanned input
  m.remat_policy = "none"  # laplax.models.remat: none | full | dots_saveable | ...
  m.attention_impl = ml_collections.FieldReference(None, field_type=str)
  # 'xavier' | 'trunc_normal' (DeiT-III) | 'timm' (the authors' timm models; laplax.models.vit.INITS)
  m.weight_init = "xavier"
  m.dtype = "float32"  # compute; parameters and optimiser state stay param_dtype
  m.param_dtype = "float32"
  m.update(overrides)
  return m


def adamw(lr: float, *, warmup_steps: int, weight_decay: float = 0.05, clip_norm: float = 1.0,
          final_lr_fraction: float = 0.01, b2: float = 0.999) -> ml_collections.ConfigDict:
  """AdamW (laplax.train.optim OPTIMIZERS) on a linear warm-up + cosine learning rate."""
  o = ml_collections.ConfigDict()
  o.name = "adamw"  # laplax.train.optim.OPTIMIZERS: 'adamw' | 'muon'
  o.schedule = "cosine"  # laplax.train.optim.SCHEDULES: 'cosine' | 'warmdown'
  o.lr = lr
  o.final_lr_fraction = final_lr_fraction
  o.warmup_steps = warmup_steps
  o.weight_decay = weight_decay
  o.b1 = 0.9
  o.b2 = b2
  o.weight_decay_end = ml_collections.FieldReference(None, field_type=float)  # None: constant
  o.clip_norm = clip_norm  # <= 0: no clipping
  o.clip_mode = "global"  # 'global' (one norm over all gradients) | 'per_tensor' (DINO)
  o.grad_accum_steps = 1
  o.skip_nonfinite = False  # True: a NaN/inf step is skipped (as large runs do), not fatal
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
  m = ml_collections.ConfigDict()
  m.matrix_lr = 0.02
  m.embedding_lr = 0.3
  m.unembedding_lr = 0.004
  m.scalar_lr = 0.004
  m.width_reference = 768
  m.adam_b1 = 0.8
  m.adam_b2 = 0.95
  m.adam_eps = 1e-10
  m.momentum_start = 0.85
  m.momentum = 0.95
  m.momentum_warmup_steps = 300
  m.ns_steps = 5
  m.distributed = False  # True: Newton-Schulz sharded over the mesh (laplax.train.optim)
  return m


def text_data(*, sources, vocab_size: int = 2048, seq_len: int = 256, batch_size: int = 16,
              eval_batch_size: int = 32) -> ml_collections.ConfigDict:
  """A text corpus for the lm task: files, directories (recursive), globs, JSONL or parquet,
  tokenised once by a BPE of `vocab_size` (laplax.data.text), in windows of seq_len + 1."""
  d = ml_collections.ConfigDict()
  d.name = "text"
  d.sources = tuple(sources)  # files, directories (recursive) or globs
  d.suffixes = (".txt", ".rst", ".py")  # what directory sources contribute
  d.include_stdlib = False  # also the Python standard library (.py) as a code corpus
  d.cache_dir = ""  # '' = ~/.cache/laplax/text (tokenizers and token shards)
  # True: every host sees cache_dir (NFS, gs://; checked at start). False: detected; hosts with
  # their own disks exchange their shares of the tokenised corpus through the workdir.
  d.shared_cache = False
  d.tokenize_group_mb = 256.0  # text per unit of tokenising work (hosts share the units)
  d.vocab_size = vocab_size  # BPE vocabulary incl. the BOS token
  d.tokenizer_train_chars = 2_000_000
  d.val_fraction = 0.02  # the last 2 % of every document
  d.seq_len = seq_len
  d.batch_size = batch_size  # global, in windows of seq_len + 1 tokens
  d.eval_batch_size = eval_batch_size
  d.eval_windows = 0  # first N validation windows (0 = all)
  return d


def chat_data(*, rows: str, train: dict, val: dict, seq_len: int, batch_size: int,
              eval_batch_size: int, vocab_size: int) -> ml_collections.ConfigDict:
  """Conversation mixtures for the chat task (laplax.tasks.chat): data.train / data.val are
  {name: {kind, path, split, start, size, weight}} (kinds: laplax.data.chat_tasks.KINDS),
  rendered by the pretraining run's tokenizer into packed windows or padded rows."""
  d = ml_collections.ConfigDict()
  d.name = "chat"
  d.rows = rows  # 'packed' (mid-training: all tokens) | 'padded' (SFT: assistant tokens)
  d.train = ml_collections.ConfigDict(train)
  d.val = ml_collections.ConfigDict(val)
  d.tokenizer = ""  # '' = init_from's tokenizer.json (the ids the parameters were trained on)
  d.vocab_size = vocab_size  # the pretraining run's (validation traces the model before data)
  d.words = ""  # the spelling tasks' word list (one per line); '' = words of data.words_from
  d.words_from = ()  # text files, directories or globs to take words from
  d.mixture_seed = 42  # nanochat's TaskMixture shuffle seed
  d.max_tokens = 2048  # render_conversation's cut (nanochat's)
  d.epochs = 1.0  # passes over the training rows when total_steps = 0
  d.seq_len = seq_len
  d.batch_size = batch_size  # global, in rows
  d.eval_batch_size = eval_batch_size
  d.eval_windows = 0  # first N validation rows / windows (0 = all)
  d.cache_dir = ""  # '' = ~/.cache/laplax/text
  d.shared_cache = False  # True: every host sees cache_dir (checked); False: one copy per host
  return d


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
  c.data = data
  c.optim = copy.deepcopy(base.optim)
  c.optim.schedule = "warmdown"
  c.optim.warmup_steps = 0
  c.optim.warmdown_fraction = warmdown_fraction
  c.optim.final_lr_fraction = 0.0
  c.optim.lr_scale = lr_scale
  c.evals = ml_collections.ConfigDict({"val": evaluator("bpb", every=0)})
  return c


def gpt(*, depth: int = 4, width: int = 128, head_dim: int = 32, init: str = "glorot"
        ) -> ml_collections.ConfigDict:
  """A nanochat-style GPT (laplax.models.gpt): its shape and every switch, at their defaults.
  init: 'glorot' (the CPU configs, so earlier CPU numbers stay comparable) or 'nanochat'
  (nanochat's MLP init at ae0bf52; configs/pod/gpt_d20.py)."""
  m = ml_collections.ConfigDict()
  m.name = "gpt"
  m.depth = depth
  m.width = width  # 0 = 64 * depth
  m.head_dim = head_dim  # width / head_dim heads
  m.num_kv_heads = 0  # 0 = no GQA
  m.mlp_ratio = 4
  m.laplacian_heads = laplacian_heads(0)  # k or a per-layer list
  m.rope_theta = 10000.0  # nanochat's Laplacian fork: 100000
  m.rope_table_dtype = "float32"  # 'bfloat16': cos / sin rounded as nanochat keeps them
  m.qk_scale = 1.0  # q, k times this after QK-norm (nanochat's Laplacian fork: 1.2)
  m.logit_softcap = 15.0
  m.attention_impl = ml_collections.FieldReference(None, field_type=str)
  m.dtype = "float32"
  m.param_dtype = "float32"
  m.init = init  # fc1's initialiser: glorot | nanochat (laplax.models.gpt.INITS)
  m.vocab_multiple = 64
  m.scan_layers = False  # nn.scan over blocks (faster compiles; the pod configs' choice)
  # none | full | dots_saveable | dots_no_batch_saveable | save_attention_out |
  # save_qkv_attention_out (laplax.models.remat)
  m.remat_policy = "none"
  m.loss_chunk = 0  # > 0: chunked cross-entropy, never the float32 (B, T, V) logits
  return m


def gpt_d20_model() -> ml_collections.ConfigDict:
  """nanochat's depth-20 GPT on a pod (configs/pod/gpt_d20.py and its chat stages): 10 heads of
  128, k = 5, nanochat's init (nanochat/gpt.py at ae0bf52: MLP c_fc uniform +-sqrt(3 / 1280)),
  bf16 compute, splash attention, scanned blocks with full remat, chunked cross-entropy."""
  m = gpt(depth=20, width=1280, head_dim=128, init="nanochat")
  m.laplacian_heads = laplacian_heads(5)
  m.attention_impl = "splash"
  m.dtype = "bfloat16"
  m.param_dtype = "float32"
  m.scan_layers = True
  m.remat_policy = "full"
  m.loss_chunk = 256
  return m


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
  # Newton-Schulz on each chip's share of the matrices (laplax.train.optim.scale_by_muon)
  o.muon.distributed = True
  return o


def gpt_d20_stage_base(*, log_every: int, every_steps: int) -> ml_collections.ConfigDict:
  """What d20's chat stages (configs/pod/gpt_d20_mid.py, _sft.py) take from the pretraining
  run: its mesh, model and optimiser, with the embedding lr of nanochat's mid_train.py and
  chat_sft.py at ae0bf52 (0.2; base_train.py's became 0.3 at that commit)."""
  base = run("gpt_d20", "lm", log_every=log_every, every_steps=every_steps)
  base.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "model": 1})
  base.model = gpt_d20_model()
  base.optim = gpt_d20_optim(warmdown_fraction=0.0)  # each stage sets its own schedule
  base.optim.muon.embedding_lr = 0.2
  return base


def lm_optim() -> ml_collections.ConfigDict:
  """The lm task's optimiser section: AdamW with parameter groups on nanochat's warm-up /
  constant / warm-down schedule, and Muon's settings for optim.name='muon'."""
  o = ml_collections.ConfigDict()
  # 'adamw' (with the parameter groups below) or 'muon' (optim.muon); laplax.train.optim.make
  o.name = "adamw"
  o.schedule = "warmdown"  # nanochat's: warm-up, constant, linear warm-down
  o.lr = 3e-3  # AdamW's peak lr (unused by 'muon')
  o.embed_lr_scale = 10.0  # AdamW's parameter groups: embedding and lm_head lr scales
  o.unembed_lr_scale = 1.0
  o.warmup_steps = 30
  o.warmdown_fraction = 0.3
  o.final_lr_fraction = 0.0
  o.weight_decay = 0.0
  o.b1 = 0.9
  o.b2 = 0.95
  o.clip_norm = 1.0
  o.grad_accum_steps = 1
  o.muon = muon()
  o.skip_nonfinite = False  # True: a NaN/inf step is skipped, not fatal
  return o


def dino_sections(c: ml_collections.ConfigDict, *, out_dim: int = 1024, hidden_dim: int = 256,
                  bottleneck_dim: int = 64, global_size: int = 32, local_size: int = 16,
                  num_local: int = 4, blur_sigma=(0.1, 1.0), warmup_teacher_temp_epochs=0.3,
                  freeze_last_layer_epochs=0.1) -> ml_collections.ConfigDict:
  """DINO's head, multicrop and dino sections on c (the dino task; laplax.tasks.dino), with
  DINO's optimiser: AdamW at `c.optim`'s lr with weight decay on a cosine 0.04 -> 0.4 and each
  parameter's gradient clipped to norm 3.0. The defaults are CPU-sized (blur sigma (0.1, 2.0)
  px is DINO's for 224 px crops); the temperatures and momenta are DINO's."""
  c.head = ml_collections.ConfigDict({"out_dim": out_dim, "hidden_dim": hidden_dim,
                                      "bottleneck_dim": bottleneck_dim, "num_layers": 3})
  c.multicrop = ml_collections.ConfigDict()
  c.multicrop.global_size = global_size
  c.multicrop.local_size = local_size
  c.multicrop.num_local = num_local
  c.multicrop.global_scale = (0.4, 1.0)
  c.multicrop.local_scale = (0.05, 0.4)
  c.multicrop.blur_sigma = tuple(blur_sigma)
  c.dino = ml_collections.ConfigDict()
  c.dino.student_temp = 0.1
  c.dino.teacher_temp = 0.07
  c.dino.warmup_teacher_temp = 0.04
  c.dino.warmup_teacher_temp_epochs = warmup_teacher_temp_epochs
  c.dino.momentum_teacher = 0.996
  c.dino.centre_momentum = 0.9
  c.dino.freeze_last_layer_epochs = freeze_last_layer_epochs
  return c


def dino_optim(lr: float, *, warmup_steps: int) -> ml_collections.ConfigDict:
  """DINO's AdamW: weight decay on a cosine 0.04 -> 0.4, each parameter's gradient clipped to
  norm 3.0 (main_dino.py's clip_gradients)."""
  o = adamw(lr, warmup_steps=warmup_steps, weight_decay=0.04, clip_norm=3.0)
  o.weight_decay_end = 0.4
  o.clip_mode = "per_tensor"
  return o


def classification_loss(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds the classification task's loss keys to `c`: softmax cross-entropy, no mixing."""
  c.loss = "softmax_xent"  # 'softmax_xent' | 'sigmoid_xent' (DeiT-III's BCE, mean over B x K)
  c.bce_binary_targets = False  # sigmoid_xent: targets > 0 -> 1 (DeiT-III), needs smoothing 0
  c.mixup = ml_collections.ConfigDict()  # laplax.data.mixup, on the device in the step
  c.mixup.mixup_alpha = 0.0  # Beta(a, a) blend of each image with the reversed batch; 0: off
  c.mixup.cutmix_alpha = 0.0  # Beta(a, a) box pasted from the reversed batch; 0: off
  c.mixup.switch_prob = 0.5  # both on: CutMix with this probability, else Mixup
  c.mixup.prob = 1.0  # chance that a batch is mixed at all
  return c


def deit3(c: ml_collections.ConfigDict, *, crop: str = "rrc") -> ml_collections.ConfigDict:
  """DeiT-III's recipe (Touvron et al. 2022, their ImageNet-1k command) on a classification
  config: crop + flip ('rrc': random-resized crop; 'src': simple random crop, reflect padding),
  3-Augment, colour jitter 0.3, Mixup 0.8 / CutMix 1.0 switched with p 0.5, BCE on binarised
  mixed targets without label smoothing, trunc_normal(0.02) initialisation. LayerScale (1e-6
  for S/B/L), drop-path, optimiser and schedule stay the config's (DeiT-III: LAMB, no clipping,
  repeated augmentation; laplax keeps AdamW and does not repeat examples)."""
  if crop not in ("rrc", "src"):
    raise ValueError(f"crop={crop!r}; use 'rrc' or 'src'")
  # The same ops in memory and streamed (laplax.data.ops).
  c.data.augment = ("rrc(0.08,1)" if crop == "rrc" else "pad_crop(4,reflect)", "flip",
                    "three_augment", "color_jitter(0.3)")
  classification_loss(c)
  c.loss = "sigmoid_xent"
  c.bce_binary_targets = True
  c.mixup.mixup_alpha = 0.8
  c.mixup.cutmix_alpha = 1.0
  c.optim.label_smoothing = 0.0
  c.model.weight_init = "trunc_normal"
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

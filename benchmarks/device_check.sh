#!/usr/bin/env bash
# One accelerator check, under 8 minutes on one H200: (a) laplacian_attention against a float64
# oracle (fp32 / bf16, xla / cudnn, forward and gradients), (b) ViT-S train-step time with every
# head Laplacian against the baseline (and a k=0 control), (b') the attention op alone, xla vs
# cudnn, (c) a short CIFAR-10 training of the baseline and of k=H, test accuracies.
#
#   bash benchmarks/device_check.sh --cifar /path/to/cifar10_jpg.zip        # on the GPU
#   JAX_PLATFORMS=cpu bash benchmarks/device_check.sh --quick --cifar ZIP   # CPU smoke run
#
# Options: --quick (tiny sizes, float32), --cifar PATH (CIFAR-10 zip / tar.gz; without it (c) is
# skipped), --epochs N (CIFAR epochs, default 10), --cache-dir DIR (prepared data; default
# $WORK/cache), --skip-oracle, --skip-vit, --skip-attention, --skip-cifar, --skip-gpu-configs.
# Runs from the repo root with $PYTHON (default: python). Prints everything; writes
# summary.json, oracle.json, vit_step.json, attention.json, cifar_k0.json, cifar_kH.json and
# device_check.log to $OUT if set, else ./device_check_out (11 files at most). Training workdirs
# go to $WORK (default: a new temp dir). Each stage has a time limit (coreutils timeout); the
# limits add up to 550 s, so the whole check stays under 10 minutes
# (CIFAR-10 decoding, limit 100 s, runs alongside the oracle). (d) the GPU-node configs
# (configs/gpu/): each one's step at its per-GPU batch compiled by the GPU compiler on this GPU
# (--aot), gpu_<config>.json (--skip-gpu-configs).
set -uo pipefail

PYTHON=${PYTHON:-python}
QUICK=0 CIFAR="" EPOCHS="" CACHE_DIR="" RUN_ORACLE=1 RUN_VIT=1 RUN_ATTN=1 RUN_CIFAR=1
RUN_GPU_CONFIGS=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --cifar) CIFAR="$2"; shift 2 ;;
    --epochs) EPOCHS="$2"; shift 2 ;;
    --cache-dir) CACHE_DIR="$2"; shift 2 ;;
    --skip-oracle) RUN_ORACLE=0; shift ;;
    --skip-vit) RUN_VIT=0; shift ;;
    --skip-attention) RUN_ATTN=0; shift ;;
    --skip-cifar) RUN_CIFAR=0; shift ;;
    --skip-gpu-configs) RUN_GPU_CONFIGS=0; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {print}' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ ! -f train.py || ! -d laplax ]]; then
  echo "error: run from the repository root (no train.py / laplax/ in $(pwd))" >&2; exit 2
fi
if [[ -n "$CIFAR" && ! -e "$CIFAR" ]]; then
  echo "error: --cifar $CIFAR does not exist: pass the CIFAR-10 zip or tar.gz" >&2; exit 2
fi

OUT_DIR=${OUT:-./device_check_out}
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/laplax_device_check.XXXXXX")}
CACHE_DIR=${CACHE_DIR:-$WORK/cache}
mkdir -p "$OUT_DIR" "$WORK"
LOG="$OUT_DIR/device_check.log"
exec > >(tee "$LOG") 2>&1
TEE_PID=$!
# Identical programs (the k=0 control) compile once; later stages reuse earlier compiles.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$WORK/jax_cache}
STATUS_FILE="$WORK/stages.tsv"; : > "$STATUS_FILE"
START=$(date +%s)

if [[ $QUICK == 1 ]]; then
  ORACLE_ARGS=(--quick)
  VIT_ARGS=(--preset mu --patch 4 --image-size 16 --channels 3 --batch 16 --dtype float32
            --repetitions 5 --warmup 1 --control)
  PRESET=mu; EPOCHS=${EPOCHS:-1}; DTYPE=float32; BATCH=64
  CIFAR_EXTRA=(--config.data.train_subset=640 --config.data.eval_subset=200
               --config.data.val_size=200 --config.optim.warmup_steps=2 --config.log_every=5)
  ATTN_ARGS=(--shape 2,64,4,16 --kv-heads 2 --causal --repetitions 5 --warmup 1)
  T_PREP=300 T_ORACLE=300 T_VIT=300 T_ATTN=120 T_CIFAR=600 T_GPU_CONFIGS=600
else
  ORACLE_ARGS=()
  VIT_ARGS=(--preset S --patch 4 --image-size 32 --channels 3 --batch 1024 --dtype bfloat16
            --repetitions 30 --warmup 3 --steps-per-call 3 --control)
  PRESET=S; EPOCHS=${EPOCHS:-10}; DTYPE=bfloat16; BATCH=512
  CIFAR_EXTRA=(--config.optim.warmup_steps=100 --config.log_every=20)
  ATTN_ARGS=(--shape 16,1024,8,64 --dtype bfloat16 --causal --repetitions 20 --warmup 2)
  T_PREP=100 T_ORACLE=80 T_VIT=140 T_ATTN=40 T_CIFAR=200  # preparation overlaps the oracle
  T_GPU_CONFIGS=90
fi

stage() {  # stage NAME SECONDS CMD...: runs CMD with a time limit, records status and seconds
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s) rc
  echo; echo "=== $name (limit ${limit}s) ==="
  timeout --kill-after=10 "$limit" "$@"; rc=$?
  local dt=$(( $(date +%s) - t0 ))
  local status=ok
  if [[ $rc == 124 || $rc == 137 ]]; then status=timeout; elif [[ $rc != 0 ]]; then status="failed(rc=$rc)"; fi
  printf '%s\t%s\t%s\n' "$name" "$status" "$dt" >> "$STATUS_FILE"
  echo "=== $name: $status in ${dt}s ==="
  return 0
}

echo "laplax device check: $(date -u +%FT%TZ), quick=$QUICK, out=$OUT_DIR, work=$WORK"
$PYTHON -c "import jax; print('jax', jax.__version__, jax.devices())" || exit 1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# Prepare CIFAR-10 (CPU only) while the oracle runs on the accelerator.
PREP_PID=""
if [[ $RUN_CIFAR == 1 && -n "$CIFAR" ]]; then
  JAX_PLATFORMS=cpu timeout $T_PREP $PYTHON -c "
import sys
import tensorflow_datasets as tfds
from laplax.data import builders
tfds.display_progress_bar(False)
for split in ('train', 'test'):
  x, y = builders.load_split('cifar10', split, source_dir=sys.argv[1], cache_dir=sys.argv[2])
  print(f'cifar10 {split}: {x.shape} ready', flush=True)
" "$CIFAR" "$CACHE_DIR" > "$WORK/prep.log" 2>&1 &
  PREP_PID=$!
fi

if [[ $RUN_ORACLE == 1 ]]; then
  stage oracle $T_ORACLE $PYTHON -m benchmarks.gpu_oracle "${ORACLE_ARGS[@]}" --json "$OUT_DIR/oracle.json"
fi

PREP_RC=0
if [[ -n "$PREP_PID" ]]; then  # the step timing below must not share the CPU with decoding
  wait "$PREP_PID"; PREP_RC=$?
  echo "CIFAR-10 preparation (rc=$PREP_RC):"; tail -n 3 "$WORK/prep.log"
fi

if [[ $RUN_VIT == 1 ]]; then
  stage vit_step $T_VIT $PYTHON -m benchmarks.vit_step_bench "${VIT_ARGS[@]}" --json "$OUT_DIR/vit_step.json"
fi
if [[ $RUN_ATTN == 1 ]]; then
  stage attention $T_ATTN $PYTHON -m benchmarks.attention_bench "${ATTN_ARGS[@]}" --json "$OUT_DIR/attention.json"
fi

if [[ $RUN_GPU_CONFIGS == 1 ]]; then
  # configs/gpu/: each config's step at its per-GPU batch (global / 8) on this one GPU, compiled
  # by the GPU compiler (train.py --aot=GPU:1): the per-GPU bytes an 8-GPU node would hold, less
  # the FSDP shards of the other 7 (parameters and Adam state: about 1 GiB for the GPT).
  GPU_KIND=h100; nvidia-smi -L 2>/dev/null | grep -q H200 && GPU_KIND=h200
  stage gpu_configs $T_GPU_CONFIGS env PYTHON="$PYTHON" QUICK=$QUICK WORK="$WORK" \
    OUT_DIR="$OUT_DIR" GPU_KIND=$GPU_KIND bash -c '
    for name in vit_b16_imagenet gpt_d20 dino_vit_s16; do
      per_gpu=$($PYTHON -c "import importlib; print(importlib.import_module(\"configs.gpu.$name\").get_config().data.batch_size // 8)")
      extra=()
      if [[ $QUICK == 1 ]]; then  # a small model of each: a smoke run of the stage
        per_gpu=2; extra=(--config.model.preset=mu)
        [[ $name == gpt_d20 ]] && extra=(--config.model.depth=2)
        [[ $name == dino_vit_s16 ]] && extra+=(--config.model.laplacian_heads=1)
      fi
      $PYTHON train.py --config=configs/gpu/$name.py --workdir="$WORK/aot_$name" \
        --aot=$GPU_KIND:1 --config.data.batch_size=$per_gpu "${extra[@]}" \
        && cp "$WORK/aot_$name/aot.json" "$OUT_DIR/gpu_$name.json"
    done'
fi

if [[ $RUN_CIFAR == 1 && -z "$CIFAR" ]]; then
  echo; echo "=== cifar: skipped (no --cifar PATH given) ==="
  printf 'cifar\tskipped\t0\n' >> "$STATUS_FILE"
elif [[ $RUN_CIFAR == 1 && $PREP_RC != 0 ]]; then
  echo; echo "=== cifar: skipped (data preparation failed or timed out, rc=$PREP_RC) ==="
  printf 'cifar\tprep_failed\t0\n' >> "$STATUS_FILE"
elif [[ $RUN_CIFAR == 1 ]]; then
  HEADS=$($PYTHON -c "from laplax.models import vit; print(vit.preset('$PRESET')['num_heads'])")
  # Both runs at once on one accelerator (each gets ~45% of its memory): compiles overlap.
  # Their images/s are therefore shared-device numbers, not speed measurements.
  cifar_run() {  # cifar_run K TAG
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 $PYTHON train.py --config=configs/cifar10_vit.py \
      --workdir="$WORK/cifar_$2" --config.data.source_dir="$CIFAR" \
      --config.data.cache_dir="$CACHE_DIR" --config.model.preset=$PRESET \
      --config.model.patch_size=4 --config.data.augment="('pad_crop(4)','flip')" \
      --config.model.dtype=$DTYPE \
      --config.data.batch_size=$BATCH --config.num_epochs=$EPOCHS \
      --config.model.laplacian_heads=$1 "${CIFAR_EXTRA[@]}" --verbosity=-1 2>&1 \
      | sed -u "s/^/[$2] /"
  }
  export -f cifar_run
  export PYTHON WORK CIFAR CACHE_DIR PRESET DTYPE BATCH EPOCHS
  export CIFAR_EXTRA_STR="${CIFAR_EXTRA[*]}"
  stage cifar $T_CIFAR bash -c '
    set -o pipefail
    CIFAR_EXTRA=($CIFAR_EXTRA_STR)
    cifar_run 0 k0 & p0=$!
    cifar_run '"$HEADS"' kH & p1=$!
    wait $p0; r0=$?; wait $p1; r1=$?
    exit $(( r0 || r1 ))'
  for tag in k0 kH; do
    [[ -f "$WORK/cifar_$tag/results.json" ]] && cp "$WORK/cifar_$tag/results.json" "$OUT_DIR/cifar_$tag.json"
  done
fi

echo; echo "=== summary ($(( $(date +%s) - START ))s in all) ==="
$PYTHON - "$OUT_DIR" "$STATUS_FILE" "$QUICK" "$(( $(date +%s) - START ))" <<'EOF'
import json, pathlib, sys
out, status_file, quick, seconds = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
load = lambda name: json.loads((out / name).read_text()) if (out / name).exists() else None
stages = {}
for line in open(status_file):
  name, status, dt = line.rstrip("\n").split("\t")
  stages[name] = {"status": status, "seconds": int(dt)}
summary = {"quick": quick, "seconds": seconds, "stages": stages}
oracle = load("oracle.json")
if oracle:
  summary["oracle"] = {"counts": oracle["counts"], "worst": {}}
  for r in oracle["results"]:
    key = f"{r['dtype']}/{r['implementation']}"
    if r["status"] == "UNAVAILABLE":
      summary["oracle"]["worst"].setdefault(key, "UNAVAILABLE")
    else:
      prev = summary["oracle"]["worst"].get(key)
      if not isinstance(prev, float) or r["worst_rel_err"] > prev:
        summary["oracle"]["worst"][key] = r["worst_rel_err"]
  print(f"oracle: {oracle['counts']}; worst relative error per dtype/impl: "
        + ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in summary["oracle"]["worst"].items()))
attn = load("attention.json")
if attn:
  summary["attention"] = {mode: attn[mode]["ratios"] for mode in ("forward", "forward+backward")}
  for mode, ratios in summary["attention"].items():
    print(f"attention {mode}: " + ", ".join(f"{k} {r['ratio']:.3f}" for k, r in ratios.items()))
vit = load("vit_step.json")
if vit:
  summary["vit_step"] = {"images_per_s": {k: v["images_per_s"] for k, v in vit["variants"].items()},
                         "ratios": vit["ratios"], "control_ratio": vit.get("control_ratio")}
  print("vit step images/s: " + ", ".join(f"{k} {v:.0f}" for k, v in summary["vit_step"]["images_per_s"].items()))
  for k, r in vit["ratios"].items():
    print(f"vit step time ratio {k}: {r['ratio']:.3f} [{r['ci_lo']:.3f}-{r['ci_hi']:.3f}]")
  if vit.get("control_ratio"):
    r = vit["control_ratio"]
    print(f"vit step control k=0/k=0: {r['ratio']:.3f} [{r['ci_lo']:.3f}-{r['ci_hi']:.3f}]")
for tag in ("k0", "kH"):
  res = load(f"cifar_{tag}.json")
  if res:
    summary[f"cifar_{tag}"] = {"test_accuracy": res["test"]["accuracy"],
                               "val_accuracy": res["val"]["accuracy"], "steps": res["step"],
                               "laplacian_heads": res["laplacian_heads"]}
    print(f"cifar {tag} ({res['laplacian_heads']}): test accuracy {res['test']['accuracy']:.4f}, "
          f"val {res['val']['accuracy']:.4f} after {res['step']} steps")
print("stages: " + ", ".join(f"{k} {v['status']} ({v['seconds']}s)" for k, v in stages.items()))
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(f"summary written to {out / 'summary.json'}")
EOF
exec 1>&- 2>&-
wait "$TEE_PID" 2>/dev/null || true

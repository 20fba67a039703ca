"""What `python -m laplax.data.fetch` downloads: each source's files, where nanochat fetches them
(the URLs below), its licence, and the layout laplax.data.fetch writes below --dest.

The URLs are configuration: `--base_url=URL` fetches every source from URL/<name>/<file> (a
mirror laid out like this table; the tests' loopback server), `--url=NAME=URL` one source from
URL/<file>. Where each comes from in nanochat (karpathy/nanochat at ae0bf52 and the authors'
fork yuchongzhang/nanochat at 1f70b55): the `origin` of each entry.
"""

from __future__ import annotations

import dataclasses

HF = "https://huggingface.co/datasets"
# nanochat's public bucket (the identity conversations, the CORE eval bundle).
KARPATHY_S3 = "https://karpathy-public.s3.us-west-2.amazonaws.com"

# The corpora's shards hold about this many characters each (nanochat's
# dev/repackage_data_reference.py: chars_per_shard = 250_000_000, for both corpora).
CHARS_PER_SHARD = 250_000_000
# nanochat's BOS-aligned best-fit loader (the fork's nanochat/dataloader.py, as ae0bf52's)
# crops about 35 % of the tokens it reads ("Approximately 35% of all tokens are discarded due
# to cropping"; speedrun.sh before 1ddaad1: "240 / (1 - 0.35) = 370 shards are needed"), so a
# horizon of T tokens reads T / (1 - 0.35) tokens of shards. laplax packs without cropping:
# the same count leaves it that much to spare.
CROP_FRACTION = 0.35


@dataclasses.dataclass(frozen=True)
class Source:
  """One downloadable set: `files` below `base_url`, converted into `writes` below --dest."""
  name: str
  what: str
  licence: str
  base_url: str
  files: tuple[str, ...]
  writes: str
  origin: str


@dataclasses.dataclass(frozen=True)
class Corpus(Source):
  """A pretraining corpus of parquet shards shard_00000.parquet ... (a 'text' column); the last,
  shard `last_shard`, is the validation shard. `chars_per_token`: nanochat's estimate for its
  32768-token BPE on this corpus (what --depth turns into a shard count)."""
  last_shard: int = 0
  chars_per_token: float = 0.0
  chars_per_token_source: str = ""

  def shard_name(self, index: int) -> str:
    return f"shard_{index:05d}.parquet"


FINEWEB_EDU = Corpus(
    name="fineweb_edu",
    what="FineWeb-Edu sample-100BT, shuffled into 1,823 parquet shards of ~250M characters "
         "(karpathy/fineweb-edu-100b-shuffle)",
    licence="ODC-By 1.0 (FineWeb-Edu; Common Crawl terms of use)",
    base_url=f"{HF}/karpathy/fineweb-edu-100b-shuffle/resolve/main",
    files=(),
    writes="fineweb_edu/shard_NNNNN.parquet: shards 0 .. N-1 and the validation shard "
           "shard_01822 (nanochat's base_data/ layout; a 'text' column)",
    origin="nanochat/dataset.py at ae0bf52 (BASE_URL, MAX_SHARD = 1822)",
    last_shard=1822,
    chars_per_token=4.8,
    chars_per_token_source="nanochat speedrun.sh before 1ddaad1 (2026-01-31): 'Assume our "
                           "tokenizer is 4.8 chars/token'",
)

CLIMBMIX = Corpus(
    name="climbmix",
    what="NVIDIA ClimbMix 400B, detokenised and shuffled into 6,543 parquet shards of ~250M "
         "characters (karpathy/climbmix-400b-shuffle): nanochat's corpus since 2026-03-04, the "
         "one the fork's newest runs/speedrun.sh downloads",
    licence="CC BY-NC 4.0 (nvidia/Nemotron-ClimbMix)",
    base_url=f"{HF}/karpathy/climbmix-400b-shuffle/resolve/main",
    files=(),
    writes="climbmix/shard_NNNNN.parquet: shards 0 .. N-1 and the validation shard "
           "shard_06542 (nanochat's base_data_climbmix/ layout; a 'text' column)",
    origin="nanochat/dataset.py at 324e69c and later (MAX_SHARD = 6542); the fork's "
           "runs/speedrun.sh at 1f70b55 ('6542')",
    last_shard=6542,
    # dev/LOG.md 2026-03-04: 'approx 150 data shards (~7B tokens)' trained on:
    # 250e6 chars x (1 - 0.35) / (7e9 / 150 tokens) = 3.48 characters per token.
    chars_per_token=3.48,
    chars_per_token_source="derived from nanochat dev/LOG.md 2026-03-04: ~150 shards for ~7B "
                           "trained tokens",
)

CORPORA = {c.name: c for c in (FINEWEB_EDU, CLIMBMIX)}

SETS = (
    Source(
        name="smoltalk",
        what="smol-smoltalk: 460K train / 24K test general conversations (SFT)",
        licence="Apache-2.0",
        base_url=f"{HF}/HuggingFaceTB/smol-smoltalk/resolve/main",
        files=tuple(f"data/train-{i:05d}-of-00004.parquet" for i in range(4))
        + ("data/test-00000-of-00001.parquet",),
        writes="smoltalk/train.parquet (the four train shards in one file), "
               "smoltalk/test.parquet: a 'messages' column",
        origin="tasks/smoltalk.py (load_dataset('HuggingFaceTB/smol-smoltalk'))"),
    Source(
        name="mmlu",
        what="MMLU, 57 subjects: dev 285, test 14,042, auxiliary_train 99,842",
        licence="MIT",
        base_url=f"{HF}/cais/mmlu/resolve/main",
        files=("all/dev-00000-of-00001.parquet", "all/test-00000-of-00001.parquet",
               "all/auxiliary_train-00000-of-00001.parquet"),
        writes="mmlu/dev/<subject>_dev.csv, mmlu/test/<subject>_test.csv (header question,"
               "choice0..choice3,answer), mmlu/auxiliary_train.jsonl ({question, choices, "
               "answer, subject}: the fork's SFT mixture)",
        origin="tasks/mmlu.py (load_dataset('cais/mmlu', 'all'))"),
    Source(
        name="gsm8k",
        what="GSM8K main: train 7,473 / test 1,319",
        licence="MIT",
        base_url=f"{HF}/openai/gsm8k/resolve/main",
        files=("main/train-00000-of-00001.parquet", "main/test-00000-of-00001.parquet"),
        writes="gsm8k/train.jsonl, gsm8k/test.jsonl ({question, answer})",
        origin="tasks/gsm8k.py (load_dataset('openai/gsm8k', 'main'))"),
    Source(
        name="arc",
        what="AI2 ARC, Easy and Challenge: train / validation / test",
        licence="CC BY-SA 4.0",
        base_url=f"{HF}/allenai/ai2_arc/resolve/main",
        files=tuple(f"{subset}/{split}-00000-of-00001.parquet"
                    for subset in ("ARC-Easy", "ARC-Challenge")
                    for split in ("train", "validation", "test")),
        writes="arc/ARC-Easy-<split>.jsonl, arc/ARC-Challenge-<split>.jsonl (Hugging Face rows: "
               "question, choices{text, label}, answerKey), arc/arc_easy_test.jsonl, "
               "arc/arc_challenge_test.jsonl (llm-foundry rows: query, choices, gold)",
        origin="tasks/arc.py (load_dataset('allenai/ai2_arc', subset))"),
    Source(
        name="humaneval",
        what="HumanEval: 164 Python problems (their tests run generated code: a sandbox only)",
        licence="MIT",
        base_url=f"{HF}/openai/openai_humaneval/resolve/main",
        files=("openai_humaneval/test-00000-of-00001.parquet",),
        writes="humaneval/HumanEval.jsonl.gz (task_id, prompt, entry_point, "
               "canonical_solution, test)",
        origin="tasks/humaneval.py (load_dataset('openai/openai_humaneval'))"),
    Source(
        name="identity",
        what="nanochat's 1K synthetic identity conversations",
        licence="MIT (nanochat)",
        base_url=KARPATHY_S3,
        files=("identity_conversations.jsonl",),
        writes="identity_conversations.jsonl (one {messages: [...]} a line)",
        origin="tasks/customjson.py and scripts/chat_sft.py at ae0bf52"),
    Source(
        name="words",
        what="dwyl/english-words words_alpha.txt, the spelling tasks' word list (370K words)",
        licence="Unlicense",
        base_url="https://raw.githubusercontent.com/dwyl/english-words/refs/heads/master",
        files=("words_alpha.txt",),
        writes="words_alpha.txt (one word a line)",
        origin="tasks/spellingbee.py at ae0bf52 (WORD_LIST_URL)"),
    Source(
        name="core",
        what="the CORE eval bundle (DCLM's in-context-learning tasks: core.yaml, eval_data/, "
             "eval_meta_data.csv with the random baselines)",
        licence="each task its own (the DCLM / llm-foundry ICL sets)",
        base_url=KARPATHY_S3,
        files=("eval_bundle.zip",),
        writes="eval_bundle/core.yaml, eval_bundle/eval_meta_data.csv, eval_bundle/eval_data/"
               "... (the zip, unpacked)",
        origin="scripts/base_eval.py (EVAL_BUNDLE_URL), the fork's and ae0bf52's"),
)

SOURCES: dict[str, Source] = {**CORPORA, **{s.name: s for s in SETS}}
# A name for every fine-tuning and evaluation set at once.
ALIASES = {"sets": tuple(s.name for s in SETS)}

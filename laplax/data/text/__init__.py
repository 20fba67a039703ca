"""Text for language modelling: corpora, BPE, token shards on disk, grain pipelines.

config -> `corpus.list_documents` (files, directories, globs, local or gs://; plain text, JSONL
with a `text` field, or parquet with a `text` column; optionally the Python standard library as
a code corpus) -> `corpus.split_documents` (train / val: in a plain file the last
`val_fraction`, cut at a line break; in a JSONL / parquet file an evenly spaced `val_fraction`
of its records) -> `Tokenizer.train` (laplax.data.tokenizer, rustbpe) on the training text ->
`shards.tokenize_corpus` (tiktoken, once: uint16 / uint32 `.npy` shards in the data directory,
per group of files; every host tokenises its share of the groups, meta.json written last) ->
`shards.TokenShards` (memory-mapped or, on gs://, read by seek; random access to windows) ->
`pipeline.train_dataset` (grain: shuffled windows of seq_len + 1 tokens, each host its own,
checkpointable iterator) and `pipeline.eval_batches` (ordered, padded, masked).
`preparation.prepare` runs the whole chain from a config.

Packing: every document becomes [<|bos|>] + its tokens; documents are concatenated and the
stream is cut into shards. Window i of a shard is tokens [i L, i L + L] (L = seq_len): windows
overlap by the one token that is the last target of window i and the first input of i + 1, so
every token after a shard's first is predicted exactly once by the ordered validation pass.

Bits per byte: a token's byte length is the length of its UTF-8 bytes (0 for special tokens,
which are neither scored nor counted, as in nanochat's evaluate_bpb).

Multi-host: process 0 trains the tokenizer and sends it to the others; each host tokenises its
share of the corpus, into `cache_dir` when every host sees it (a shared file system, gs://),
else through the workdir into each host's own `cache_dir` (laplax.data.host_cache).

Chat fine-tuning: `conversations` renders conversation mixtures (laplax.data.chat) once into a
token cache that `shards.TokenShards` reads as packed windows and `conversations.Rows` as
padded rows with the assistant mask.

Import the submodules directly (`from laplax.data.text import corpus, shards`): nothing is
re-exported here.
"""

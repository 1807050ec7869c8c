"""The defaults of syncing, encoding, the lifecycle commands and the Client, in one place, each
with why it is what it is.

The CLI's options, the worker's Options, the reindex Options and the Python API read these. A
value that belongs to one module stays beside its code: a new model's HNSW m and ef_construction
(catalog/registry.py), `pgembed serve`'s pool and limits (serve/), a search's k (search/).
"""

from __future__ import annotations

# The model `model add` uses when none is named (resolved offline: see encode/embedder.py).
MODEL = "all-MiniLM-L6-v2"

# A claim lasts this long before another worker may take the keys over. A live worker renews the
# claims it holds every third of it (sync/leases.py), so only a dead worker's keys wait this long.
LEASE_SECONDS = 60.0
# The sync loop polls this often even when no NOTIFY arrives (a lost NOTIFY costs this much).
POLL_SECONDS = 5.0
# Failed attempts before a key moves to pgembed.failures (retries back off 2, 4, 8 ... s).
MAX_ATTEMPTS = 5
# How often a worker says it is alive; status shows workers heard from within LIVE_WORKER_SECONDS.
HEARTBEAT_SECONDS = 10.0
LIVE_WORKER_SECONDS = 60
# The longest wait between reconnect attempts after the database went away.
MAX_BACKOFF_SECONDS = 30.0

# Texts per encode call on a CPU, measured on all-MiniLM-L6-v2 at ~44 word pieces (BENCHMARKS.md):
# on one thread batches of 16 ran 4 % faster than 32 (less padding); on two threads of a loaded
# machine 32 ran 30 % faster than 16 (fewer thread barriers); 8 was worst on both. A GPU (CUDA or
# Apple's MPS) wants far larger batches to fill its cores.
CPU_BATCH_SIZE = 32
GPU_BATCH_SIZE = 256

# Keys a worker claims at once: enough texts that sorted batches pad little (with 256 claimed and
# batches of 32, ~9 % padding on ~48+-12 word-piece texts; 64 claimed: ~31 %), few enough that a
# crash loses little work.
CPU_CLAIM_SIZE = 256
GPU_CLAIM_SIZE = 1024
# A reindex fills its shadow beside a live model: smaller claims keep the live model's batches
# from waiting long behind it.
REINDEX_CLAIM_SIZE = 64
# `model add --backfill` (a new model, a long queue, a command in the foreground): larger claims
# sort more texts together, so batches pad less; 2,000-row fills without the index took a median
# 4.84 s against 5.30 s with the daemon's 256 (four alternated pairs).
BACKFILL_CLAIM_SIZE = 1024

# Index builds: HNSW builds fastest when the graph fits in maintenance_work_mem. Unless the user
# names a value, a build gets the graph's estimated size (lifecycle/indexbuild.py `graph_bytes`),
# at least MAINTENANCE_WORK_MEM and at most MAINTENANCE_WORK_MEM_CAP; past the cap it says what
# the graph needs. 1M rows of 384 dimensions took 2.7 GB (issue 24's measurement).
MAINTENANCE_WORK_MEM = "1GB"
MAINTENANCE_WORK_MEM_CAP_MB = 4096
PARALLEL_MAINTENANCE_WORKERS = 2
# What the CLI's options and the Python API accept: pgvector's limits for m and ef_construction,
# PostgreSQL's for max_parallel_maintenance_workers; claims past 10,000 keys only lengthen leases.
HNSW_M_RANGE = (2, 100)
EF_CONSTRUCTION_RANGE = (4, 1000)
MAX_PARALLEL_MAINTENANCE_WORKERS = 1024
MAX_CLAIM_SIZE = 10_000

# A reindex switch waits at most this long for the table lock, then tries again.
SWITCH_LOCK_TIMEOUT = "2s"
SWITCH_ATTEMPTS = 30

# Query vectors a process keeps (one per distinct text and model settings).
QUERY_CACHE_SIZE = 1024
# The longest query text accepted: a model reads a few hundred word pieces (MiniLM: 256), and the
# cache above keeps the texts, so a bound here bounds its memory (1024 x 10,000 characters).
MAX_QUERY_CHARS = 10_000


def batch_size(device: str) -> int:
    """Texts per encode call on `device` (cpu, or a GPU: cuda or mps)."""
    return CPU_BATCH_SIZE if device == "cpu" else GPU_BATCH_SIZE


def claim_size(device: str) -> int:
    """Keys a sync worker claims at once on `device` (cpu, or a GPU: cuda or mps)."""
    return CPU_CLAIM_SIZE if device == "cpu" else GPU_CLAIM_SIZE


# Connections a Client (or AsyncClient) opens at most: searches beyond it wait for one to free up.
# A search holds a connection only while its statements run, never while a model loads or encodes.
POOL_MAX_SIZE = 10
# How long a call waits for a free pooled connection (or for the server to answer again) before
# it fails with a DatabaseError: as long as a first connection may take (connect_timeout).
POOL_WAIT_SECONDS = 10.0

# DDL on a watched table (model add, remove, a reindex's start) waits at most DDL_LOCK_TIMEOUT for
# its lock: while it waits, every query on the table queues behind it. It then rolls back, says
# who holds the table, and tries again after a pause (doubling from DDL_RETRY_FIRST_PAUSE up to
# DDL_RETRY_MAX_PAUSE), giving up after DDL_LOCK_WAIT_SECONDS in all.
DDL_LOCK_TIMEOUT = "2s"
# A chunk table's lock, taken just after its watched table's (alter-table): a session that holds
# the chunk table and now waits for the watched table would deadlock with us. Giving up before
# PostgreSQL's deadlock check (deadlock_timeout, 1 s) makes alter-table the one that retries.
CHUNK_LOCK_TIMEOUT = "200ms"
DDL_RETRY_FIRST_PAUSE = 0.5
DDL_RETRY_MAX_PAUSE = 5.0
DDL_LOCK_WAIT_SECONDS = 300.0
# `model add` and a reindex's start queue the table's existing rows in batches of this many keys,
# each its own short transaction that holds no lock an application's write waits for.
ENQUEUE_BATCH = 10_000

# Texts are cut to this many characters per word piece of the model's window (max_seq_length)
# before anything tokenizes them, on every path (sync, queries, eval): a tokenizer reads a text
# whole before it truncates (one 15 MB row took 52 s and 2.95 GB), and English needs ~4-5
# characters per word piece. 32 is generous (runs of spaces, 100-character unknown words), so the
# cut never changes a vector a reader would notice; a row cut this way is marked truncated.
CHARS_PER_WORD_PIECE = 32
# The query-vector cache's bound in bytes (its texts as Python holds them, plus its vectors),
# beside its QUERY_CACHE_SIZE entries: 1,024 short queries of a 384-dimension model take ~1.6 MB,
# while 1,024 texts of MAX_QUERY_CHARS could take 40 MB.
QUERY_CACHE_BYTES = 4 * 1024 * 1024
# Chunked models (`--long-texts chunk`): consecutive windows share this many word pieces, so a
# sentence cut by one window's end is whole in the next; a row has at most MAX_WINDOWS windows
# (64 of MiniLM's 254 word pieces: ~14,000, a long book chapter), the rest is marked truncated.
CHUNK_OVERLAP = 32
MAX_WINDOWS = 64
# A window smaller than this many word pieces (a tiny --max-seq-length, a long document prefix)
# would cut a text into scraps: --long-texts chunk refuses it.
MIN_WINDOW = 32
# A chunked model reads at most this many characters per word piece of its windows past the first
# (English needs ~4-5; the first window keeps CHARS_PER_WORD_PIECE): 64 windows of MiniLM read
# ~130,000 characters, not 524,000. A text whose windows would need more is marked truncated.
CHUNK_CHARS_PER_WORD_PIECE = 8

# Dynamic batching of query encoding (search/batching.py: `pgembed serve`, AsyncClient): query
# texts in one batch at most, and the seconds an idle encoder waits for companions.
QUERY_BATCH = 32
QUERY_BATCH_WAIT = 0.002
# Requests `pgembed serve` answers at once at most; past it a 503 with Retry-After.
SERVE_MAX_IN_FLIGHT = 256
# Seconds a statement of `pgembed serve` runs at most (PostgreSQL's statement_timeout; 0: none):
# a search waiting on a lock, or a hybrid query whose words match thousands of long texts (each
# parsed again), would hold one of the server's 8 connections for as long as it ran.
SERVE_STATEMENT_TIMEOUT = 30.0
SERVE_STATEMENT_TIMEOUT_MAX = 2147483.0  # PostgreSQL's limit: 2^31 - 1 milliseconds
# Seconds `pgembed serve` gives a request's headers, and then its body, to arrive (else 408), and
# the requests in flight to finish after SIGTERM (else 503): below a load balancer's idle timeout
# and an orchestrator's grace period (Kubernetes: 30 s) in the common setups.
SERVE_REQUEST_TIMEOUT = 10.0
SERVE_STOP_TIMEOUT = 10

# `pgembed load` refuses a record (a JSON line, a CSV row) longer than this many bytes, with one
# line that says where, instead of reading on: a file with no line end (/dev/zero) grew to 22 GB,
# and a CSV field costs ~16 times its size in memory on the way (the csv module's 4-byte buffer,
# the COPY row), so 16 MiB keeps a load under ~300 MB. Far more than any model reads: a chunked
# model embeds ~130,000 characters of a row.
MAX_RECORD_BYTES = 16 * 1024 * 1024

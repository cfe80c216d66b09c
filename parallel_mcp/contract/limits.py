"""Every input limit of the public contract. The services enforce them for every caller; the
HTTP API's serializers, its OpenAPI schema and the MCP tools' JSON Schemas read them from here.
docs/errors.md lists them for users."""

from __future__ import annotations

# -- text -------------------------------------------------------------------------------------
# Names: kinds, keys, namespaces, external ids, worker ids, labels, client tokens.
NAME_LENGTH = 200
# Free text from people: reasons, progress messages.
REASON_LENGTH = 10_000
# A failure's error text (tracebacks fit).
ERROR_LENGTH = 100_000
# Event type names ("task.completed").
EVENT_TYPE_LENGTH = 64

# -- JSON documents (input, output, metadata, payload, context) ---------------------------------
# Nesting depth: a scalar is depth 0, ``{"a": 1}`` and ``[1]`` are depth 1. Deeper documents are
# refused when written, so nothing stored can make a read, a claim or a page fail.
MAX_JSON_DEPTH = 64
# (The size ceiling is the MAX_JSON_BYTES setting: see parallel_mcp.conf.)

# -- numbers ------------------------------------------------------------------------------------
# Durations in milliseconds (lease_ms, timeout_ms, retry delays): up to ten years.
MAX_MS = 10 * 365 * 24 * 3600 * 1000
# Retry delays (delay_ms, max_delay_ms) and the computed backoff: up to a year.
MAX_RETRY_DELAY_MS = 365 * 24 * 3600 * 1000
PRIORITY_MIN = -1_000_000
PRIORITY_MAX = 1_000_000
MAX_ATTEMPTS = 1_000_000
MAX_PARALLEL = 1_000_000
# List offsets: beyond this a caller pages with cursors (and no database overflows).
MAX_OFFSET = 2**31 - 1
# The remote orchestrator honours ``offset`` by reading (and dropping) that many rows through
# the API's keyset pages: deeper than this, page with the API's cursors.
MAX_REMOTE_OFFSET = 10_000
# Event ids are 64-bit integers.
MAX_EVENT_ID = 2**63 - 1
# How far back prune_runs may look (a century, in milliseconds).
MAX_PRUNE_AGE_MS = 100 * 365 * 24 * 3600 * 1000

# -- datetimes ----------------------------------------------------------------------------------
# Every datetime argument has a year from MIN_YEAR to MAX_YEAR, as written (in its own time
# zone, so that a schema pattern on the text states the rule exactly): far enough from Python's
# year-1 and year-9999 edges that converting to UTC, adding a duration or a cursor step never
# overflows.
MIN_YEAR = 1900
MAX_YEAR = 8999

# -- lists --------------------------------------------------------------------------------------
# Tasks per enqueue_tasks call. An empty batch is a no-op (nothing is written, the answer is
# an empty list), at every door: a program that fans out over a list may find it empty.
MIN_BATCH = 0
MAX_BATCH = 10_000
# Entries of one task's depends_on, and of pause_task's blocked_by.
MAX_DEPENDENCIES = 10_000
# Claims per claim_next_tasks call.
MAX_CLAIM_BATCH = 100
# A batch's leases carry "<client_token>#<n>" (n < MAX_CLAIM_BATCH) in a NAME_LENGTH column.
BATCH_TOKEN_LENGTH = NAME_LENGTH - 1 - len(str(MAX_CLAIM_BATCH - 1))
# Kinds named in one claim or listing.
MAX_KINDS = 1_000
# Event types named in one listing.
MAX_EVENT_TYPES = 100

# -- worker presence --------------------------------------------------------------------------
HOSTNAME_LENGTH = 255
# pid and concurrency are stored as 32-bit integers.
INT32_MAX = 2**31 - 1

# -- MCP tasks (io.modelcontextprotocol/tasks) --------------------------------------------------
# Keys of one pause's inputRequests, and of one tasks/update's inputResponses.
MAX_INPUT_KEYS = 100
# The whole inputResponses of one tasks/update, as compact JSON (bytes): answers from a client
# are small (a form, a sampled message); anything bigger is refused before it is stored.
MAX_INPUT_RESPONSES_BYTES = 256 * 1024
# Task ids one subscriptions/listen may name (notifications/tasks) ...
MAX_LISTEN_TASK_IDS = 100
# ... and how many such streams one pmcp_mcp process serves at once.
MAX_TASK_LISTEN_STREAMS = 1_000

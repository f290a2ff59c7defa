"""Every setting, declared once (the specification's names: ``MODEL_PATH``, ``SERVER_PORT``, ...)."""

from __future__ import annotations

from dataclasses import dataclass

from phi_api.settings.parsing import (
    _boolean,
    _database_url,
    _integer,
    _number,
    _sampling,
    _stripped,
    _text,
    setting,
)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# how a model writes tool calls (phi_api.service.tool_formats.FORMATS, and auto: what its folder says)
TOOL_PARSERS = ("auto", "generic", "hermes", "phi4_mini", "mistral", "llama3_json", "pythonic")
# how a model's thinking is told apart (phi_api.service.reasoning.thinking_markers)
REASONING_PARSERS = ("auto", "think", "none")


@dataclass(frozen=True)
class Serving:
    """The first part of the settings (:class:`Declared`): the model, the HTTP server, the engine and the models it
    serves."""

    MODEL_PATH: str = setting("", _stripped, "ONNX Runtime GenAI model folder to serve (or MODEL, or MODELS_FILE; "
                              "`phi-api serve` without any of them prepares the default model)")
    MODEL_ID: str = setting("phi-3.5-mini", _text(), "The model name clients must send")
    MODEL: str = setting("", _stripped, "A model to serve by name (an alias of the catalog, or REPO[/SUBFOLDER][@REV] "
                         "on the Hugging Face Hub), pulled at start-up unless it is in the cache, served under that "
                         "name; instead of MODEL_PATH and MODEL_ID")
    SERVER_HOST: str = setting("0.0.0.0", _text(), "Listen address")
    SERVER_PORT: int = setting(8000, _integer(1, 65535), "Listen port")
    WEB_CONCURRENCY: int = setting(1, _integer(1, 64), "gunicorn workers; the cores are shared among them")
    PRELOAD_MODEL: bool = setting(True, _boolean, "Load and check the model in the master, before the fork")
    MAX_CONCURRENT_REQUESTS: int = setting(10, _integer(1, 10_000),
                                           "Generations running at once in the whole server; more get 429")
    GENERATION_CONFIG: str = setting("auto", _text(choices=("auto", "off")),
                                     "A model's sampling defaults: auto reads its folder's generation_config.json "
                                     "(temperature, top_p, top_k, min_p, repetition_penalty, ...) for the fields a "
                                     "request omits, as vLLM does; off: the server's own (DEFAULT_TEMPERATURE, no "
                                     "penalty)",
                                     per_model=True)
    SAMPLING_DEFAULTS: tuple = setting((), _sampling,
                                       "Sampling defaults over the folder's, as a JSON object of temperature, top_p, "
                                       "top_k, min_p, repetition_penalty, repeat_last_n (its window: -1 all tokens), "
                                       "presence_penalty, frequency_penalty (vLLM's --override-generation-config); "
                                       "per model in MODELS_FILE's options",
                                       per_model=True)
    DEFAULT_MAX_TOKENS: int = setting(1024, _integer(1, 1_000_000), "max_tokens when a request gives none")
    DEFAULT_TEMPERATURE: float = setting(0.7, _number(0.0, 2.0),
                                         "temperature when a request gives none and the model has no default of "
                                         "its own (GENERATION_CONFIG, SAMPLING_DEFAULTS)")
    GENERATION_TIMEOUT: float = setting(600.0, _number(0.0, exclusive_low=True),
                                        "Seconds a generation may run (waiting for room included)", engine="timeout")
    REQUEST_READ_TIMEOUT: float = setting(30.0, _number(0.0, exclusive_low=True),
                                          "Seconds a request body may take to arrive; then 408")
    STREAM_WRITE_TIMEOUT: float = setting(1.0, _number(0.0, exclusive_low=True),
                                          "Seconds a streamed write may wait on a client that does not read")
    CORS_ORIGINS: str = setting("*", _text(), "Allowed origins, comma-separated")
    API_KEYS: str = setting("", lambda name, raw: str(raw), "Comma-separated keys; none: no authentication")
    API_KEYS_FILE: str = setting("", _stripped, "A JSON file of named keys with optional limits (requests and "
                                 "tokens per minute, tokens per day); with API_KEYS, the accepted keys")
    MAX_REQUEST_SIZE_MB: float = setting(10.0, _number(0.0, 1024.0, exclusive_low=True), "Larger bodies get 413")
    LOG_LEVEL: str = setting("INFO", _text(choices=LOG_LEVELS, upper=True), "Logging level")
    LOG_FORMAT: str = setting("text", _text(choices=("text", "json")),
                              "Log lines as text, or one JSON object each (json)")
    INTRA_OP_THREADS: int = setting(0, _integer(0, 256), "ONNX Runtime threads per worker; 0: cores / workers",
                                 engine="threads", per_model=True, value=lambda s: s.intra_op_threads)
    MEMORY_LIMIT_MB: float = setting(0.0, _number(0.0, 10_000_000.0),
                                     "Memory of the whole server: weights, processes, keys and values of every model "
                                     "in every worker; 0: three quarters of the machine's or container's memory")
    KV_CACHE_MB: float = setting(0.0, _number(0.0, 10_000_000.0),
                                 "Key/value memory one model may hold in one worker at most; 0: the worker's share "
                                 "of MEMORY_LIMIT_MB",
                                 engine="kv_budget_bytes", per_model=True, value=lambda s: s.kv_budget_bytes)
    KV_IDLE_SECONDS: float = setting(600.0, _number(0.0, exclusive_low=True),
                                     "Kept prefixes no request used for this long give their memory back")
    MAX_BATCH_ROWS: int = setting(32, _integer(1, 1024), "Sequences one worker advances together at most",
                                  engine="max_rows", per_model=True)
    ENCODER_BATCH_TOKENS: int = setting(8192, _integer(1, 1_000_000),
                                        "Tokens of one encoder call at most, padding included (rows times the "
                                        "longest input): embedding and reranking inputs of concurrent requests are "
                                        "encoded together up to this and MAX_BATCH_ROWS",
                                        engine="encoder_batch_tokens", per_model=True)
    PREFILL_CHUNK_TOKENS: int = setting(64, _integer(1, 1_000_000), "Prompt tokens per engine step",
                                        engine="prefill_chunk", per_model=True)
    PREFIX_CACHE: str = setting("on", _text(choices=("on", "exact", "off")),
                                "Reuse of earlier requests' keys and values: on (prompts and answers), exact (prompts "
                                "only, answering bit for bit as cold), off", engine="prefix_cache", per_model=True)
    PREFIX_CACHE_DIR: str = setting("", _stripped,
                                    "Folder of prompts' keys and values on disk, shared by the workers and kept across "
                                    "restarts; empty: prefixes/ in phi-api's cache folder",
                                    engine="prefix_disk_dir", value=lambda s: s.prefix_disk_dir)
    PREFIX_CACHE_DISK_MB: float = setting(8192.0, _number(0.0, 1_000_000_000.0),
                                          "Most the prefixes on disk take (least recently used leave first); 0 turns "
                                          "the disk tier off",
                                          engine="prefix_disk_bytes",
                                          value=lambda s: int(s.PREFIX_CACHE_DISK_MB * 2**20))
    PREFILL_SLICE_SECONDS: float = setting(0.2, _number(0.0, 60.0, exclusive_low=True),
                                           "Most time one engine iteration spends on a prompt while others wait or "
                                           "run (BATCH_INVARIANT false, PREFIX_CACHE on or off)",
                                           engine="prefill_slice", per_model=True)
    BATCH_INVARIANT: bool = setting(True, _boolean,
                                    "A request's tokens do not depend on what else runs: every decode step has an even "
                                    "row count, prompts go in whole chunks on the grid, drafts are checked as alone (on"
                                    " row-wise operators: whole chunks only); false: answers may differ in last bits",
                                    engine="batch_invariant", per_model=True)
    TOOL_PARSER: str = setting("auto", _text(choices=TOOL_PARSERS),
                               "How the model writes tool calls: auto (what its folder says), generic, hermes, "
                               "phi4_mini, mistral, llama3_json or pythonic", engine="tool_parser", per_model=True)
    REASONING_PARSER: str = setting("auto", _text(choices=REASONING_PARSERS),
                                    "How the model's thinking is told apart from its answer: auto (by the thinking "
                                    "markers its tokenizer holds), think (<think>...</think> in the text, also where "
                                    "they are no tokens of its own), or none (the thinking stays in the answer)",
                                    engine="reasoning_parser", per_model=True)
    SPECULATIVE_DRAFT_MAX: int = setting(8, _integer(0, 64),
                                         "Most prompt-lookup draft tokens one step verifies (adaptive below it); 0 "
                                         "turns speculative decoding off", engine="draft_max", per_model=True)
    SPECULATIVE_DRAFT_MODEL: str = setting("", _stripped,
                                           "Folder of a draft model: a smaller model of the same vocabulary whose "
                                           "greedy tokens the model checks, for a request alone in its step (in "
                                           "MODELS_FILE: \"draft\": the id of another entry); empty: none",
                                           per_model=True)
    SPECULATIVE_HISTORY_TOKENS: int = setting(8192, _integer(0, 1 << 20),
                                              "Tokens of each key's earlier answers a worker keeps per model to draft "
                                              "from (for that key only; the 8 most recent keys; with "
                                              "BATCH_INVARIANT false, or on a graph of phi-api's own "
                                              "operators: docs/identical-answers.md); 0: none",
                                              engine="history_tokens", per_model=True)
    KV_CACHE_DTYPE: str = setting("auto", _text(choices=("auto", "float32", "int8", "int4")),
                                  "Keys and values in memory: float32, int8 (a quarter of the memory), int4 (an eighth "
                                  "and a scale per token; needs phi-api's attention operator), or auto (int8 where "
                                  "float32 would take 256 KB a token or more)", per_model=True)
    INT4_KERNEL: str = setting("auto", _text(choices=("auto", "phi-api", "mlas")),
                               "The kernel of 4-bit and 8-bit weights: phi-api's own (AVX-512 VNNI, one pass over "
                               "the weights for all rows of a step), mlas (ONNX Runtime's), or auto (phi-api's where "
                               "the CPU and its built library allow, else mlas)", per_model=True)
    ATTENTION_KERNEL: str = setting("auto", _text(choices=("auto", "phi-api", "onnxruntime")),
                                    "The attention over int8 or float32 keys and values: phi-api's own (AVX-512 "
                                    "VNNI, keys and values read once per step, in the operator's layout; drafts "
                                    "checked in the batched step), onnxruntime (GroupQueryAttention), or auto "
                                    "(phi-api's where the CPU and its built library allow)", per_model=True)
    PLAYGROUND: bool = setting(True, _boolean, "Serve the chat playground at /; false: / is a 404")
    MODELS_FILE: str = setting("", _stripped,
                               "A JSON file declaring several models (ids, folders, options); else MODEL_PATH")
    ALLOW_QUERY_API_KEY: bool = setting(True, _boolean,
                                        "Accept a key in the query string (?api_key=, ?api-key=), for the clients "
                                        "that can send it nowhere else; false: headers only (proxies log query "
                                        "strings)")
    ALLOW_PULL: bool = setting(False, _boolean, "Let clients make the server download models (Ollama's /api/pull, "
                               "POST /v1/models/load by name) without API keys; with API_KEYS, a key is enough")
    MODEL_IDLE_SECONDS: float = setting(0.0, _number(0.0),
                                        "Models loaded at run time that no request used for this long are unloaded "
                                        "(Ollama's keep_alive may ask for longer); 0: kept until unloaded")
    KEEP_ALIVE_MAX_SECONDS: float = setting(3600.0, _number(0.0),
                                            "Longest an ordinary key's keep_alive keeps a model loaded at run time "
                                            "after its request; it never shortens a model's time nor gives one to a "
                                            "model kept until unloaded (admin keys: any keep_alive)")
    MAX_MODELS: int = setting(4, _integer(1, 64), "Most models the server holds at once; more loads get 400")


@dataclass(frozen=True)
class Declared(Serving):
    """The server's settings as declared: each once, with its default, its parser (which checks its bounds) and
    its description; a new setting is one line in its part (:class:`Serving`, or here: the server's state, what
    each key may keep there, and the waiting line). :class:`phi_api.settings.Settings` adds what derives from
    them."""

    DATA_DIR: str = setting("", _stripped,
                            "Folder of what must last across restarts and upgrades: keys' usage, stored responses, "
                            "the Batch API's files and batches; empty: data/ in phi-api's cache folder")
    BATCH_DIR: str = setting("", _stripped,
                             "Folder of the Batch API's files and batches; empty: batches/ in DATA_DIR")
    DATABASE_URL: str = setting("", _database_url,
                                "A postgresql:// URL: keys' usage and limits, stored responses, files and batches live "
                                "there, shared by every replica; empty: SQLite files in DATA_DIR (one machine)")
    BATCH_LEASE_SECONDS: float = setting(60.0, _number(1.0, 86_400.0),
                                         "How long a claimed batch line stays its worker's without word from it (the "
                                         "worker renews it while the line runs); then another worker or replica "
                                         "takes it")
    BATCH_CONCURRENCY: int = setting(2, _integer(0, 1024),
                                     "Batch lines each worker runs at once, at the lowest priority and outside "
                                     "MAX_CONCURRENT_REQUESTS; 0: batches wait")
    BATCH_FILE_MB: float = setting(100.0, _number(0.0, 100_000.0, exclusive_low=True),
                                   "Largest file POST /v1/files takes; larger get 413")
    UPLOAD_READ_TIMEOUT: float = setting(600.0, _number(0.0, exclusive_low=True),
                                         "Seconds the body of POST /v1/files may take to arrive; then 408 (its room "
                                         "in the key's file quota is held meanwhile)")
    FILES_MAX_PER_KEY: int = setting(100, _integer(1, 10_000_000),
                                     "Most files one API key may store (Batch API files; its batches' output "
                                     "files are written whatever it holds); more get 400 storage_quota_exceeded")
    FILES_MAX_MB_PER_KEY: float = setting(1024.0, _number(0.0, 10_000_000.0, exclusive_low=True),
                                          "Most megabytes of files one API key may store, its running batches' "
                                          "answers included; an upload past it gets 400 storage_quota_exceeded, a "
                                          "batch's answers past it are not kept (nor its lines not yet run: its "
                                          "error file says so)")
    RESPONSES_STORE_MAX: int = setting(1000, _integer(0, 10_000_000),
                                       "Most Responses API responses kept for previous_response_id, per API key (one "
                                       "key's never evict another's); 0 keeps none")
    RESPONSES_STORE_MB_PER_KEY: float = setting(1024.0, _number(0.0, 10_000_000.0, exclusive_low=True),
                                                "Most megabytes of stored responses (each with its whole conversation) "
                                                "per API key; past it its oldest go; one larger alone is not kept")
    RESPONSES_STORE_SECONDS: float = setting(30 * 86_400.0, _number(0.0, exclusive_low=True),
                                             "How long a stored Responses API response is kept (OpenAI: 30 days)")
    CONVERSATIONS_MAX_PER_KEY: int = setting(1000, _integer(0, 10_000_000),
                                             "Most Conversations API conversations one API key keeps (they last until "
                                             "deleted); past it, creating one is a 400")
    CONVERSATIONS_MB_PER_KEY: float = setting(256.0, _number(0.0, 10_000_000.0, exclusive_low=True),
                                              "Most megabytes of items one API key keeps in all its conversations; "
                                              "past it, adding items (or a response that would) is a 400")
    CONVERSATION_ITEMS_MAX: int = setting(10_000, _integer(1, 10_000_000),
                                          "Most items one conversation holds; past it, adding items (or a response "
                                          "that would) is a 400")
    BACKGROUND_CONCURRENCY: int = setting(2, _integer(0, 1024),
                                          "Background responses (Responses API, background: true) each worker runs at "
                                          "once, each through the gate as its key's request (inside "
                                          "MAX_CONCURRENT_REQUESTS and the key's limits); 0: background responses are "
                                          "refused (400)")
    BACKGROUND_MAX_PER_KEY: int = setting(16, _integer(1, 1_000_000),
                                          "Most background responses one API key may have queued or running; more "
                                          "get 429 until one ends")
    BACKGROUND_ENDED_MAX_PER_KEY: int = setting(1000, _integer(1, 10_000_000),
                                                "Most ended background responses (completed, incomplete, failed or "
                                                "cancelled) one API key keeps for polling; when another ends, its "
                                                "oldest-ended go (one key's never evict another's)")
    BACKGROUND_EVENTS_MAX: int = setting(20_000, _integer(16, 10_000_000),
                                         "Most events of one streamed background response kept for a client that "
                                         "resumes (starting_after); older ones go, and resuming before them is a 400")
    BACKGROUND_EVENTS_SECONDS: float = setting(3600.0, _number(0.0, exclusive_low=True),
                                               "How long a streamed background response's events are kept after it "
                                               "ends (its response object stays RESPONSES_STORE_SECONDS)")
    BACKGROUND_LEASE_SECONDS: float = setting(30.0, _number(1.0, 86_400.0),
                                              "How long a running background response stays its worker's without word "
                                              "from it (renewed while it runs); then any worker or replica marks it "
                                              "failed")
    PREFIX_CACHE_SHARED: bool = setting(False, _boolean,
                                        "Let API keys reuse each other's prompts (in memory and on disk); off: a "
                                        "prompt is reused only for requests of the key that sent it")
    MAX_QUEUED_REQUESTS: int = setting(0, _integer(0, 100_000),
                                       "Generation requests each worker lets wait for a free slot, shared fairly among "
                                       "keys, before answering 429; 0: 429 at once when every slot is taken")
    QUEUE_TIMEOUT: float = setting(30.0, _number(0.0, exclusive_low=True),
                                   "Seconds a request may wait in that line; then 429")

"""``phi-api bench long``: long prompts and long contexts, the server beside the raw engine (ONNX Runtime GenAI,
every core) in one run, and each figure as a share of the machine's limits measured in the same run
(``bench roofline``).

- Prompts: the first token of a fresh prompt of 1k, 4k, 8k and 16k tokens (as far as the model's context goes):
  the server's time over the raw engine's, paired run by run, and the multiply-adds of the weights and of the
  attention over the int8 dot-product peak.
- Decode at contexts of 1k, 4k and 8k tokens, one stream and 8 at once: tokens a second, and the bytes a step reads
  (the weights once, each row's keys and values) over the read bandwidth; and the step's bound, the larger of that
  time and its multiply-adds' over the int8 peak, over the step's time (``server_share_of_bound``). The raw
  engine's decode beside it where its float32 keys and values fit in memory.

Prompts are token ids (the same for both), each led by tokens no earlier prompt shares, so that no prompt cache
answers them; the streams of a decode measurement share a document and end with tokens of their own. Medians of
``--runs``.

The server runs without speculative decoding (``SPECULATIVE_DRAFT_MAX=0``, unless ``--setting`` says otherwise):
a decode figure is a share of what one token a step can read, and the raw engine drafts nothing. With drafts, the
answers here (greedy continuations of repeated text, and a random-weight model's loops) copy themselves, and a
step gives several tokens: until 2026-11-29 the bench ran at the server's defaults, and its one-stream decode
figures above 100% of the bandwidth were drafts kept (``bench spec`` measures those).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from phi_api.bench.client import stream_completion
from phi_api.bench.common import PROMPT, emit, median, say

if TYPE_CHECKING:
    from phi_api.bench.roofline import Limits

MAX_TOKENS = 64  # decoded per stream in the decode measurements
TAIL = 8  # each decoding stream's own last prompt tokens
RAW_MEMORY_SHARE = 0.5  # the raw engine's float32 keys and values may take this share of the machine's memory
UNDRAFTED = {"SPECULATIVE_DRAFT_MAX": "0"}  # the server's settings before --setting's: one token a step


@dataclass(frozen=True)
class Costs:
    """What one token costs the model: multiply-adds and bytes of its weights, and per token of context, its
    attention's multiply-adds (a query against a key and a value) and its keys' and values' bytes."""

    weight_macs: float
    weight_bytes: float
    attention_macs_per_context: float
    kv_bytes_per_context: float
    raw_weight_bytes: float  # the raw engine's: its float32 matrices in float32

    def prompt_macs(self, tokens: int) -> float:
        """A whole prompt of ``tokens``: every token's weights, and each token's attention to those before it."""
        return tokens * self.weight_macs + self.attention_macs_per_context * tokens * (tokens + 1) / 2

    def step_bytes(self, rows: int, context: int, raw: bool = False) -> float:
        """A decode step of ``rows`` rows at ``context`` tokens each: the weights once, each row's keys and values
        (``raw``: the raw engine's weights)."""
        weights = self.raw_weight_bytes if raw else self.weight_bytes
        return weights + rows * context * self.kv_bytes_per_context

    def step_bound(self, rows: int, context: int, int8_gmacs: float, read_gbs: float) -> tuple[float, str]:
        """The least time a decode step of ``rows`` rows at ``context`` tokens can take (seconds) on a machine of
        this peak and bandwidth, and which of the two bounds it: its multiply-adds over the int8 peak, or its bytes
        over the bandwidth. One row reads far more than it computes; at short contexts 8 rows of a 4-bit model
        compute about as long as they read, and either may be the larger."""
        compute = rows * (self.weight_macs + context * self.attention_macs_per_context) / int8_gmacs / 1e9
        memory = self.step_bytes(rows, context) / read_gbs / 1e9
        return (compute, "compute") if compute > memory else (memory, "memory")


def model_costs(model_path: str, kv_dtype: str = "auto", int4_kernel: str = "auto") -> Costs:
    """Read from the decoder graph and its configuration: the quantized matrices' multiply-adds (MatMulNBits: what
    the int8 peak bounds), the bytes of every matrix's weights as the server keeps them (a quantized model's float32
    matrices in bfloat16 where phi-api's kernel serves, ``INT4_KERNEL``), the keys' and values' bytes
    (``KV_CACHE_DTYPE``)."""
    import onnx

    from phi_api.engine.runtime.folder import ModelFolder
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.engine.runtime.rewrite import BF16_TYPE
    from phi_api.settings import cache_root

    folder = ModelFolder.read(Path(model_path))
    graph = onnx.load(str(Path(model_path) / folder.decoder_file), load_external_data=False).graph
    macs, weight_bytes = _quantized_costs(graph)
    decoder = folder.decoder
    heads, layers = int(decoder["num_attention_heads"]), int(decoder["num_hidden_layers"])
    attention = 2.0 * heads * int(decoder["head_size"]) * layers
    served = LanguageModel(model_path, cache_dir=cache_root() / "runtime", kv_dtype=kv_dtype, int4_kernel=int4_kernel)
    kinds = {node.op_type for node in onnx.load(str(served.decoder_file), load_external_data=False).graph.node}
    floats = _float_parameters(graph)
    return Costs(macs, weight_bytes + (2 if BF16_TYPE in kinds else 4) * floats, attention,
                 served.spec.kv_bytes_per_token, weight_bytes + 4 * floats)


def _quantized_costs(graph: Any) -> tuple[float, float]:
    """The multiply-adds a token and the bytes of the graph's MatMulNBits (weights and scales)."""
    from phi_api.engine.runtime.graphs import node_attributes

    macs = weight_bytes = 0.0
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            attributes = node_attributes(node)
            k, n, bits = int(attributes["K"]), int(attributes["N"]), int(attributes.get("bits", 4))
            macs += k * n
            blocks = -(-k // int(attributes["block_size"]))  # the last one may be partial
            weight_bytes += k * n * bits / 8 + n * blocks * 4  # weights and scales
    return macs, weight_bytes


def _float_parameters(graph: Any) -> int:
    """The values of the float32 matrices a quantized graph keeps (its float32 MatMuls by a matrix of the graph)."""
    from phi_api.engine.runtime.rewrite import float_eligible

    initializers = {tensor.name: tensor for tensor in graph.initializer}
    return sum(int(np.prod(initializers[node.input[1]].dims)) for node in graph.node
               if float_eligible(node, initializers))


class Prompts:
    """Token-id prompts of exact lengths: a text's ids repeated, led by ids no earlier prompt shares."""

    def __init__(self, ids: np.ndarray, vocab: int) -> None:
        self.ids = ids
        self.vocab = vocab
        self._rng = np.random.default_rng(int(time.time()))

    def fresh(self, tokens: int) -> list[int]:
        lead = self._rng.integers(1000, min(self.vocab, 30000), 8)
        body = np.resize(self.ids, tokens - len(lead))
        return [int(token) for token in np.concatenate([lead, body])]


def raw_first_token(raw: Any, prompt: list[int]) -> float:
    return raw.generate_ids(prompt, 1).prefill_seconds


def measure_prompts(url: str, model: str, raw: Any, prompts: Prompts, lengths: list[int], runs: int,
                    costs: Costs, peak: float) -> list[dict[str, Any]]:
    """The first token of fresh prompts, the server's time paired with the raw engine's."""
    rows = []
    for tokens in lengths:
        say(f"prompt of {tokens} tokens")
        server, engine, ratios = [], [], []
        for _ in range(runs):
            reference = raw_first_token(raw, prompts.fresh(tokens)) if raw is not None else None
            result = stream_completion(url, {"model": model, "prompt": prompts.fresh(tokens), "max_tokens": 1,
                                             "temperature": 0})
            server.append(result.ttft)
            if reference is not None:
                engine.append(reference)
                ratios.append(result.ttft / reference)
        macs = costs.prompt_macs(tokens)
        row: dict[str, Any] = {"tokens": tokens, "server_s": median(server),
                               "server_tokens_per_s": tokens / median(server),
                               "server_share_of_int8_peak": macs / median(server) / 1e9 / peak}
        if engine:
            row.update(raw_s=median(engine), raw_tokens_per_s=tokens / median(engine),
                       raw_share_of_int8_peak=macs / median(engine) / 1e9 / peak,
                       server_over_raw=median(ratios))
        rows.append(row)
    return rows


def server_decode(url: str, model: str, prompts: Prompts, context: int, streams: int) -> float:
    """Aggregate decode tokens a second of ``streams`` streams at ``context`` tokens each."""
    from concurrent.futures import ThreadPoolExecutor

    # One document, each stream's own last tokens: the server computes the document once (its prefix cache copies
    # it to the other rows) and every row still reads keys and values of its own at each step.
    document = prompts.fresh(context - TAIL)
    bodies = [{"model": model, "prompt": document + prompts.fresh(TAIL), "max_tokens": MAX_TOKENS,
               "temperature": 0, "ignore_eos": True} for _ in range(streams)]
    with ThreadPoolExecutor(streams) as pool:
        results = list(pool.map(lambda body: stream_completion(url, body), bodies))
    # the span in which every stream decodes: from the last first token to the first last token
    start = max(result.arrivals[0] for result in results)
    end = min(result.arrivals[-1] for result in results)
    if end <= start:
        return sum(result.decode_rate or 0.0 for result in results)
    return sum(sum(start <= moment <= end for moment in result.arrivals) for result in results) / (end - start)


def measure_decode(url: str, model: str, raw: Any, prompts: Prompts, contexts: list[int], runs: int,
                   costs: Costs, limits: Limits, raw_fits: Any, raw_streams: set[int]) -> list[dict[str, Any]]:
    bandwidth = limits.read_gbs
    rows: list[dict[str, Any]] = []
    for context in contexts:
        for streams in (1, 8):
            say(f"decode: {streams} streams at {context} tokens")
            if rows:
                say(f"decode so far: {json.dumps(rows)}")
            rates = [server_decode(url, model, prompts, context, streams) for _ in range(runs)]
            step = costs.step_bytes(streams, context)
            rate = median(rates)
            bound, bound_by = costs.step_bound(streams, context, limits.int8_gmacs, bandwidth)
            row: dict[str, Any] = {"context": context, "streams": streams, "server_tokens_per_s": rate,
                                   "server_share_of_bandwidth": step * rate / streams / 1e9 / bandwidth,
                                   "server_share_of_bound": bound * rate / streams, "bound_by": bound_by}
            if raw is not None and raw_fits(streams, context) and streams in raw_streams:
                raw_rates = [raw.decode_ids(prompts.fresh(context), MAX_TOKENS, streams) for _ in range(runs)]
                row.update(raw_tokens_per_s=median(raw_rates),
                           raw_share_of_bandwidth=costs.step_bytes(streams, context, raw=True) * median(raw_rates)
                           / streams / 1e9 / bandwidth,
                           server_over_raw_rate=rate / median(raw_rates))
            rows.append(row)
    return rows


def server_settings(given: list[str]) -> dict[str, str]:
    """The server's settings: :data:`UNDRAFTED`, then each ``NAME=VALUE`` given (``--setting``)."""
    return {**UNDRAFTED, **dict(item.split("=", 1) for item in given)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from phi_api.bench.raw import RawEngine
    from phi_api.bench.roofline import measure
    from phi_api.bench.server import Server

    say("the machine's limits")
    limits = measure()
    settings = server_settings(args.setting)
    costs = model_costs(args.model_path, settings.get("KV_CACHE_DTYPE", "auto"), settings.get("INT4_KERNEL", "auto"))
    raw = RawEngine(args.model_path) if args.raw else None
    context_length = int(json.loads((Path(args.model_path) / "genai_config.json").read_text())["model"]
                         ["context_length"])
    lengths = [n for n in (int(v) for v in args.prompts.split(",")) if n + MAX_TOKENS <= context_length]
    contexts = [n for n in (int(v) for v in args.contexts.split(",")) if n + MAX_TOKENS <= context_length]
    config = json.loads((Path(args.model_path) / "genai_config.json").read_text())["model"]
    decoder = config["decoder"]
    text_ids = np.asarray(raw.encode(PROMPT) if raw else np.arange(1000, 1400), dtype=np.int64)
    prompts = Prompts(text_ids, int(config["vocab_size"]))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    float32_kv = 2 * 4 * int(decoder["num_hidden_layers"]) * int(decoder["num_key_value_heads"]) * int(
        decoder["head_size"])

    def raw_fits(streams: int, context: int) -> bool:
        # the raw engine keeps float32 keys and values for the whole length of each row
        return streams * (context + MAX_TOKENS) * float32_kv <= RAW_MEMORY_SHARE * memory

    report: dict[str, Any] = {"model": args.model_path, "limits": limits.__dict__, "costs": costs.__dict__,
                              "settings": settings, "runs": args.runs}
    logs = Path(tempfile.mkdtemp(prefix="phi-api-bench-long-"))
    env = {"MODEL_PATH": args.model_path, "MODEL_ID": "bench-model", "MAX_CONCURRENT_REQUESTS": 16,
           **settings}
    with Server(logs, **env) as server:
        report["prompts"] = measure_prompts(server.url, "bench-model", raw, prompts, lengths, args.runs, costs,
                                            limits.int8_gmacs)
        say(f"prompts: {json.dumps(report['prompts'])}")  # a long run's first half, should the second fail
        report["decode"] = measure_decode(server.url, "bench-model", raw, prompts, contexts, args.runs, costs,
                                          limits, raw_fits, {int(n) for n in args.raw_streams.split(",")})
    return report


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True, help="the model folder (served and run raw)")
    parser.add_argument("--prompts", default="1024,4096,8192,16384", help="prompt lengths, in tokens")
    parser.add_argument("--contexts", default="1024,4000,8192", help="decode contexts, in tokens (4,000 rather than "
                        "4,096: LongRoPE models such as Phi-3.5 compute a row again when it crosses 4,096 tokens)")
    parser.add_argument("--runs", type=int, default=3, help="repetitions per figure (medians are reported)")
    parser.add_argument("--no-raw", dest="raw", action="store_false", help="the server alone")
    parser.add_argument("--raw-streams", default="1,8", help="stream counts whose decode the raw engine also "
                        "measures (its static batch computes every row's prompt: 8 rows of 4k tokens take minutes)")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the server, e.g. ATTENTION_KERNEL=onnxruntime (repeatable)")
    parser.add_argument("--out", default="", help="also write the report (JSON) here")


def main(args: argparse.Namespace) -> int:
    emit(run(args), args.out)
    return 0

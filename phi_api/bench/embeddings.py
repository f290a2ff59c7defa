"""``phi-api bench embeddings``: ``POST /v1/embeddings`` against a raw ONNX Runtime session on the same encoder
folder, and one embedding's latency while chats stream, in one run.

Why: the server encodes in a worker thread of its own that batches the inputs of concurrent requests (issue 52).
This says what that path costs over the least a client could do in-process, and how long an embedding waits when
the worker also serves a generator.

1. Throughput: embeddings a second for one request of N inputs (``--batches``) of ~L tokens each (``--lengths``,
   special tokens included), sent with ``encoding_format`` base64 as the openai SDK sends it and decoded as it
   decodes it, on a server of one worker with the default ``INTRA_OP_THREADS``. Beside it, a raw session in this
   process with as many threads: the texts tokenized with ``tokenizers`` (inside the timing), padded to the batch's
   longest, one session call, mean pooling and L2 normalisation in numpy. The two alternate call by call (their
   order swapped every repeat, a pause between calls so that neither side's idle threads spin on the other's
   time), each call on texts of its own; medians of ``--repeats``. The server cuts a request
   into calls of at most ``MAX_BATCH_ROWS`` rows and ``ENCODER_BATCH_TOKENS`` padded tokens, the raw session makes
   one call: that split is part of the ratio.
   Each figure is also a share of the machine's float32 limit measured in the same run: a large MatMul on ONNX
   Runtime with as many threads (the kernel the encoder's own MatMuls use), against the encoder's multiply-adds a
   token (its layers' projections, and its attention at that length, from config.json).
2. Latency: one ~32-token text at a time for ``--seconds``, on the idle server and then while ``--chat-streams``
   chats (128 tokens, ``ignore_eos``) stream from the generator the same worker serves: p50 and p95.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import requests

from phi_api.bench.client import stream_completion, unique
from phi_api.bench.common import PROMPT, median, percentile, say
from phi_api.bench.report import write_json
from phi_api.bench.server import Server

GENERATOR, EMBEDDER = "bench-model", "bench-embedder"
CHAT = "/v1/chat/completions"
SINGLE_TOKENS = 32  # the single text of the latency measurement
CHAT_TOKENS = 128
SETTLE_SECONDS = 0.1  # between two timed calls: one side's idle ONNX Runtime threads spin a while after a call
WORDS = tuple(PROMPT.lower().replace(",", "").replace(".", "").split())


def _tokenizer(folder: str) -> Any:
    """The folder's ``tokenizer.json``, unpadded and uncut (as the server reads it)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


class Texts:
    """Texts of about ``tokens`` tokens each (special tokens included): a serial number, then words drawn anew, so
    that no two texts are the same."""

    def __init__(self, folder: str) -> None:
        self._tokenizer = _tokenizer(folder)
        self._rng = np.random.default_rng(time.time_ns())
        self._serial = 0

    def fresh(self, count: int, tokens: int) -> list[str]:
        return [self._one(tokens) for _ in range(count)]

    def _one(self, tokens: int) -> str:
        self._serial += 1
        text = " ".join([str(self._serial), *self._rng.choice(WORDS, tokens)])
        encoding = self._tokenizer.encode(text)
        own = [place for place, special in enumerate(encoding.special_tokens_mask) if not special]
        keep = max(1, tokens - (len(encoding.ids) - len(own)))
        return text[:encoding.offsets[own[keep - 1]][1]]  # cut after its ``keep``-th own token

    def measured(self, tokens: int, sample: int = 32) -> float:
        """The mean length, in tokens, of texts made for ``tokens``."""
        return float(np.mean([len(one.ids) for one in self._tokenizer.encode_batch(self.fresh(sample, tokens))]))


class RawEncoder:
    """The least a client could do in-process: tokenize, pad to the longest, one session call, mean pooling, L2
    normalisation."""

    def __init__(self, folder: str, threads: int) -> None:
        import onnxruntime as ort

        config = json.loads((Path(folder) / "encoder_config.json").read_text(encoding="utf-8"))
        if config.get("pooling") != "mean" or not config.get("normalize"):
            raise ValueError(f"{folder}: the raw side pools by mean and normalizes; this model does not")
        self._tokenizer = _tokenizer(folder)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self._session = ort.InferenceSession(str(Path(folder) / "model.onnx"), options,
                                             providers=["CPUExecutionProvider"])
        self._inputs = {value.name for value in self._session.get_inputs()}
        self._output = str(config["output"])

    def embed(self, texts: list[str]) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.zeros((len(texts), max(len(one.ids) for one in encodings)), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, one in enumerate(encodings):
            ids[row, :len(one.ids)] = one.ids
            mask[row, :len(one.ids)] = 1
        given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = self._session.run([self._output], {name: given[name] for name in self._inputs})[0]
        weights = mask[:, :, None].astype(np.float32)
        vectors = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def float32_peak(threads: int, size: int = 1536, repeats: int = 7) -> float:
    """Multiply-adds a second of one float32 MatMul of ``size`` cubed on ONNX Runtime with ``threads`` threads (the
    median of ``repeats``): the machine's float32 limit as the encoder's kernels reach it."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "peak",
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, [size, size]) for name in "ab"],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [size, size])])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every ONNX Runtime reads (onnx writes its own newest)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {name: np.random.default_rng(0).random((size, size), dtype=np.float32) for name in "ab"}
    session.run(None, feeds)
    return size ** 3 / median([_seconds(lambda _: session.run(None, feeds), []) for _ in range(repeats)])


def macs_per_token(folder: str, length: float) -> float:
    """The encoder's multiply-adds for one token of an input of ``length`` tokens: each layer's four projections
    and two feed-forward matrices, and its attention's scores and sums over the input."""
    config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    hidden, inner = int(config["hidden_size"]), int(config["intermediate_size"])
    return int(config["num_hidden_layers"]) * (4 * hidden * hidden + 2 * hidden * inner + 2 * length * hidden)


def server_embed(http: requests.Session, url: str, texts: list[str]) -> np.ndarray:
    """One request for ``texts``, its base64 vectors decoded as the openai SDK decodes them."""
    answer = http.post(url + "/v1/embeddings", json={"model": EMBEDDER, "input": texts, "encoding_format": "base64"},
                       timeout=600)
    answer.raise_for_status()
    return np.stack([np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
                     for item in answer.json()["data"]])


def _seconds(embed: Callable[[list[str]], np.ndarray], texts: list[str]) -> float:
    started = time.perf_counter()
    embed(texts)
    return time.perf_counter() - started


def agreement(raw: RawEncoder, serve: Callable[[list[str]], np.ndarray], texts: Texts,
              lengths: list[int]) -> float:
    """Both sides' vectors of the same texts (which also warms both up): the largest difference of a coordinate."""
    differences = []
    for length in lengths:
        same = texts.fresh(4, length)
        differences.append(float(np.abs(raw.embed(same) - serve(same)).max()))
    return max(differences)


def throughput(raw: RawEncoder, serve: Callable[[list[str]], np.ndarray], texts: Texts, batches: list[int],
               lengths: list[int], repeats: int) -> list[dict[str, Any]]:
    """Embeddings a second per (batch, length), the server's and the raw session's calls alternating."""
    cells = [(rows, length) for length in lengths for rows in batches]
    times: dict[tuple[int, int], dict[str, list[float]]] = {cell: {"raw": [], "server": []} for cell in cells}
    for repeat in range(repeats):
        say(f"throughput: repeat {repeat + 1} of {repeats}")
        for cell in cells:
            sides = [("raw", raw.embed), ("server", serve)][::-1 if repeat % 2 else 1]
            for side, embed in sides:
                time.sleep(SETTLE_SECONDS)
                times[cell][side].append(_seconds(embed, texts.fresh(*cell)))
    return [_throughput_row(rows, length, times[(rows, length)], texts.measured(length)) for rows, length in cells]


def _throughput_row(rows: int, length: int, times: dict[str, list[float]], measured: float) -> dict[str, Any]:
    raw, server = median(times["raw"]), median(times["server"])
    return {"batch": rows, "tokens": length, "measured_tokens": measured, "server_embeddings_per_s": rows / server,
            "raw_embeddings_per_s": rows / raw, "server_over_raw": raw / server, "server_s": times["server"],
            "raw_s": times["raw"]}


def with_shares(rows: list[dict[str, Any]], folder: str, peak: float) -> list[dict[str, Any]]:
    """Each row with its multiply-adds a second, the server's and the raw session's, as shares of ``peak``."""
    shared = []
    for row in rows:
        per_embedding = row["measured_tokens"] * macs_per_token(folder, row["measured_tokens"])
        shared.append({**row, "server_share_of_peak": row["server_embeddings_per_s"] * per_embedding / peak,
                       "raw_share_of_peak": row["raw_embeddings_per_s"] * per_embedding / peak})
    return shared


def single_latencies(serve: Callable[[list[str]], np.ndarray], texts: Texts, seconds: float) -> list[float]:
    """One ~32-token text at a time, one after another, for ``seconds``."""
    found: list[float] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        found.append(_seconds(serve, texts.fresh(1, SINGLE_TOKENS)))
    return found


def _chats(url: str, index: int, stop: threading.Event, done: list[int]) -> None:
    body = {"model": GENERATOR, "max_tokens": CHAT_TOKENS, "ignore_eos": True, "temperature": 0,
            "messages": [{"role": "user", "content": f"{index}. {PROMPT}"}]}
    http = requests.Session()
    while not stop.is_set():
        done.append(stream_completion(url, unique(body), http, path=CHAT).tokens)


@contextmanager
def chat_load(url: str, streams: int) -> Iterator[list[int]]:
    """``streams`` chats streaming all the time; yields the token counts of the chats finished."""
    stop = threading.Event()
    done: list[int] = []
    workers = [threading.Thread(target=_chats, args=(url, index, stop, done)) for index in range(streams)]
    for worker in workers:
        worker.start()
    time.sleep(2.0)  # every stream is prefilling or decoding by now
    try:
        yield done
    finally:
        stop.set()
        for worker in workers:
            worker.join()


def _latency_row(load: str, latencies: list[float]) -> dict[str, Any]:
    return {"load": load, "requests": len(latencies), "p50_s": percentile(latencies, 0.5),
            "p95_s": percentile(latencies, 0.95)}


def latency(serve: Callable[[list[str]], np.ndarray], url: str, texts: Texts, seconds: float,
            streams: int) -> list[dict[str, Any]]:
    """A single embedding's latency, idle and under chat load."""
    say(f"latency: idle, {seconds} s")
    rows = [_latency_row("idle", single_latencies(serve, texts, seconds))]
    say(f"latency: {streams} chat streams, {seconds} s")
    with chat_load(url, streams) as chats:
        under = single_latencies(serve, texts, seconds)
    rows.append({**_latency_row(f"{streams} chat stream{'s' * (streams != 1)}", under), "chats_finished": len(chats)})
    return rows


def markdown(heads: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _throughput_cells(row: dict[str, Any]) -> list[str]:
    return [str(row["batch"]), f"{row['tokens']} ({row['measured_tokens']:.1f})",
            f"{row['server_embeddings_per_s']:.1f}", f"{row['raw_embeddings_per_s']:.1f}",
            f"{row['server_over_raw']:.2f}x", f"{row['server_share_of_peak']:.0%}", f"{row['raw_share_of_peak']:.0%}"]


def _latency_cells(row: dict[str, Any]) -> list[str]:
    return [row["load"], str(row["requests"]), f"{row['p50_s'] * 1000:.1f} ms", f"{row['p95_s'] * 1000:.1f} ms"]


def print_tables(report: dict[str, Any]) -> None:
    print(f"\nEmbeddings a second, one request of N inputs against a raw ONNX Runtime session "
          f"({report['threads']} threads; medians of {report['repeats']}); shares of this machine's float32 MatMul "
          f"peak on ONNX Runtime, {report['float32_peak_macs'] / 1e9:.1f} GMAC/s measured in this run:\n")
    print(markdown(["inputs", "tokens each (measured)", "server emb/s", "raw emb/s", "server / raw",
                    "server, of peak", "raw, of peak"],
                   [_throughput_cells(row) for row in report["throughput"]]))
    print(f"\nOne {SINGLE_TOKENS}-token embedding's latency, requests one after another for {report['seconds']} s:\n")
    print(markdown(["load", "requests", "p50", "p95"], [_latency_cells(row) for row in report["latency"]]))
    print(f"\nlargest difference of a vector coordinate, server against raw: {report['max_abs_difference']:.2g}")


def _models_file(folder: Path, model_path: str, embedding_path: str) -> Path:
    path = folder / "models.json"
    path.write_text(json.dumps({"models": [{"id": GENERATOR, "path": model_path},
                                           {"id": EMBEDDER, "path": embedding_path}]}), encoding="utf-8")
    return path


def run(args: argparse.Namespace) -> dict[str, Any]:
    from phi_api.settings import load_settings

    threads = load_settings(environ={**os.environ, "WEB_CONCURRENCY": "1"}).intra_op_threads
    batches, lengths = _ints(args.batches), _ints(args.lengths)
    texts, raw = Texts(args.embedding_path), RawEncoder(args.embedding_path, threads)
    folder = Path(tempfile.mkdtemp(prefix="phi-api-bench-embeddings-"))
    report: dict[str, Any] = {"embedding_path": args.embedding_path, "model_path": args.model_path,
                              "threads": threads, "repeats": args.repeats, "seconds": args.seconds,
                              "chat_streams": args.chat_streams, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    with Server(folder, MODELS_FILE=_models_file(folder, args.model_path, args.embedding_path), WEB_CONCURRENCY=1,
                MAX_CONCURRENT_REQUESTS=max(10, args.chat_streams + 2)) as server:
        http = requests.Session()

        def serve(batch: list[str]) -> np.ndarray:
            return server_embed(http, server.url, batch)

        report["max_abs_difference"] = agreement(raw, serve, texts, lengths)
        report["float32_peak_macs"] = float32_peak(threads)
        report["throughput"] = with_shares(throughput(raw, serve, texts, batches, lengths, args.repeats),
                                           args.embedding_path, report["float32_peak_macs"])
        report["latency"] = latency(serve, server.url, texts, args.seconds, args.chat_streams)
    return report


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--embedding-path", default="", help="the encoder folder (default: "
                        "PHI_API_TEST_EMBEDDING_PATH, else the default embedding model's prepared folder)")
    parser.add_argument("--model-path", default=os.environ.get("PHI_API_TEST_MODEL_PATH", ""),
                        help="the generator folder the chat load runs on (default: PHI_API_TEST_MODEL_PATH)")
    parser.add_argument("--repeats", type=int, default=5, help="calls per throughput figure (medians are reported)")
    parser.add_argument("--batches", default="1,8,32,128", help="inputs per request")
    parser.add_argument("--lengths", default="32,256", help="tokens per input (special tokens included)")
    parser.add_argument("--chat-streams", type=int, default=4, help="concurrent chats of the latency under load")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each latency measurement runs")
    parser.add_argument("--json", type=Path, help="also write the results (JSON) here")


def main(args: argparse.Namespace) -> int:
    if not args.embedding_path:
        from phi_api.tools.prepare_encoder import default_embedding_dir

        args.embedding_path = os.environ.get("PHI_API_TEST_EMBEDDING_PATH") or str(default_embedding_dir())
    if not args.model_path:
        print("bench embeddings needs --model-path (or PHI_API_TEST_MODEL_PATH): the generator of the chat load",
              file=sys.stderr)
        return 2
    report = run(args)
    print_tables(report)
    if args.json:
        write_json(report, args.json)
    return 0

"""The host's prepacked copy of a model: weights every worker memory-maps, so they are shared after the fork.

Why: a forked worker cannot use the master's ONNX Runtime session on every
core (its intra-op threads do not survive the fork: measured, a preloaded
worker decoded at 0.73x the master's speed), so each worker creates its own
session. Created from the original model, each session would hold its own
prepacked int4 weights on the heap (measured with 2 workers: 426 MB PSS
against 209 MB). ONNX Runtime can instead save the model with its prepacked
weights in an external data file; a session created from that file
memory-maps them, and every worker shares one page-cache copy (226 MB), with
the same greedy tokens and a faster load.

The prepacked layout depends on the CPU and on onnxruntime's version
(onnxruntime warns such a model "should only be used in the same
environment"), so the file is made on the host that serves, under a key of
the source model, the onnxruntime version and the CPU's features. It is
written to a staging folder and renamed into place, under a file lock, so
workers starting together make it once and never see half of it; a folder
that processes have mapped is never rewritten.

Before it is used, a made file must give the original's logits bit for bit
on a prompt chunk. onnxruntime 1.31 writes a broken file for some models
(measured: a Phi-3 of hidden size 128, whose every logit came out NaN);
such a file is marked unusable, and the original model is served instead
(correct, at the cost of each worker holding its own prepacked weights).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from phi_api.errors import PrepackError

if TYPE_CHECKING:
    from phi_api.engine.runtime.spec import DecoderSpec

log = logging.getLogger(__name__)

RECIPE = 2  # bump when the way the file is made changes
MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
UNUSABLE = "unusable.json"


def cpu_features() -> str:
    """The CPU's model name and feature flags, as the kernel reports them (what prepacking depends on)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return f"{fields.get('vendor_id', '')}|{fields.get('model name', '')}|{fields.get('flags', '')}"


def source_key(source: Path, decoder_file: str) -> str:
    """A key of the source model: its graph's bytes and its other files' names and sizes."""
    digest = hashlib.sha256((source / decoder_file).read_bytes())
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        if entry.is_file() and entry.name != decoder_file and not entry.name.startswith("."):
            stat = entry.stat()
            digest.update(f"{entry.name}:{stat.st_size}:{int(stat.st_mtime)};".encode())
    return digest.hexdigest()


def host_key(source: Path, decoder_file: str) -> str:
    """The folder name of ``source``'s prepacked copy on this host, with this onnxruntime."""
    import onnxruntime

    digest = hashlib.sha256(f"recipe {RECIPE};ort {onnxruntime.__version__};{cpu_features()};".encode())
    digest.update(source_key(source, decoder_file).encode())
    return digest.hexdigest()[:24]


def prepacked_model(source: Path, decoder_file: str, cache_dir: Path, spec: DecoderSpec | None = None) -> Path:
    """The model file to serve ``source``'s decoder from: its prepacked copy on this host, made now if it
    does not exist yet; the original file when the copy proved unusable. ``spec``: the graph's layout, when
    ``source`` is not the model's folder (the layout read from its ``genai_config.json`` otherwise)."""
    if spec is None:
        from phi_api.engine.runtime.spec import DecoderSpec

        spec = DecoderSpec.read(source)
    checked = spec
    return prepacked_copy(source / decoder_file, cache_dir, lambda original, made: _differs(original, made, checked),
                          spec.custom_ops)


def prepacked_copy(model_file: Path, cache_dir: Path, differs: Callable[[Path, Path], str | None],
                   custom_ops: str = "") -> Path:
    """The file to serve the graph ``model_file`` from: its prepacked copy on this host (made now if there is none
    yet), unless ``differs`` (given the original and the copy) found the copy answers otherwise: then the original.
    A decoder's and an encoder's alike."""
    folder = cache_dir / host_key(model_file.parent, model_file.name)
    made_once(folder, lambda staging: _make(model_file, staging, folder, differs, custom_ops))
    if (folder / UNUSABLE).is_file():
        return model_file
    return folder / MODEL_FILE


def made_once(folder: Path, make: Callable[[Path], None]) -> None:
    """``folder``, unless it exists, filled by ``make`` (given a staging folder beside it) and renamed into place
    under a file lock: workers starting at once make it once, and no process ever sees half of it."""
    if folder.is_dir():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # workers starting at once: one makes it, the others wait
        if folder.is_dir():
            return
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder.parent))
        try:
            make(staging)
            os.rename(staging, folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _make(model_file: Path, staging: Path, folder: Path, differs: Callable[[Path, Path], str | None],
          custom_ops: str) -> None:
    started = time.monotonic()
    source = model_file.parent
    log.info("prepacking %s for this host (once per host and CPU; the workers share it): this takes a while for "
             "a large model", source)
    _save_prepacked(model_file, staging, custom_ops)
    record = {"source": str(source), "decoder": model_file.name}
    mismatch = differs(model_file, staging / MODEL_FILE)
    if mismatch:
        for name in (MODEL_FILE, DATA_FILE):
            (staging / name).unlink(missing_ok=True)
        (staging / UNUSABLE).write_text(json.dumps({**record, "reason": mismatch}))
        log.warning("the prepacked copy of %s gave other results than the original (%s): serving the original, "
                    "whose weights each worker then holds itself", source, mismatch)
    else:
        log.info("prepacked model written to %s in %.0f s", folder, time.monotonic() - started)
    (staging / "source.json").write_text(json.dumps(record))


def _differs(original: Path, prepacked: Path, spec: DecoderSpec) -> str | None:
    """Why ``prepacked`` cannot stand for the original graph (its logits of a prompt chunk differ), or None."""
    import numpy as np

    from phi_api.engine.runtime.pool import KVPool
    from phi_api.engine.runtime.session import Decoder

    prompt = (np.arange(16, dtype=np.int64) * 7919 + 11) % max(2, spec.vocab_size)
    logits = []
    for path in (original, prepacked):
        decoder = Decoder(path, spec, threads=1)
        pool = KVPool(decoder.spec, 1, len(prompt))
        logits.append(decoder.step(pool, 0, prompt[None, :], np.array([0]), True).copy())
        decoder.unbind()
        pool.close()
        del decoder
    if np.array_equal(logits[0], logits[1]):
        return None
    finite = np.isfinite(logits[1])
    return (f"{int((~finite).sum())} of {finite.size} logits not finite" if not finite.all() else
            f"largest difference {float(np.abs(logits[0] - logits[1]).max()):.3g}")


def _save_prepacked(model: Path, folder: Path, custom_ops: str) -> None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3  # the "same environment" warning is what the key is for
    options.optimized_model_filepath = str(folder / MODEL_FILE)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", DATA_FILE)
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    options.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    if custom_ops:
        options.register_custom_ops_library(custom_ops)
    from phi_api.engine.runtime.session import ORT_ERRORS

    try:
        ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except ORT_ERRORS as exc:
        raise PrepackError(f"{model}: {exc}") from exc

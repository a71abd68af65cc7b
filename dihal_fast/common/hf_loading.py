"""Loading local Hugging Face causal-LM checkpoints whole, with errors a user can act on.

Every load (a backbone, a hybrid, an evaluator) is checked before and after transformers builds the model: the
config's layer count against the layers the safetensors headers hold (read without loading a tensor, so a
``num_hidden_layers`` of a million is refused before anything is allocated), then transformers' own loading
report (``output_loading_info``): a tensor the architecture needs and the checkpoint lacks, one it holds that
the architecture has no place for, or one of another shape is refused in one line naming the tensors, instead of
a model with made-up weights. Errors are translated once, here, where the files enter, and chained.

A ``.gguf`` file stands wherever a checkpoint directory does (``--model model.Q4_K_M.gguf``): its header is
checked first (:func:`read_gguf_header`), then :func:`gguf_view` gives it a directory in the user's cache holding
the ``config.json`` and tokenizer transformers converts from the file's metadata, so every stage reads it as it
reads a checkpoint directory; :func:`load_whole` reads the weights from the file itself, dequantized in the
requested dtype. The view is keyed by the file's path and sha256: a changed file is a new view.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from dihal_fast.common.assets import model_location
from dihal_fast.errors import DihalError, DihalValueError

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
# What transformers, safetensors and torch raise for a checkpoint or an option they cannot use (user input).
LOAD_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, RuntimeError, KeyError, TypeError, ImportError)
_LAYER_KEY = re.compile(r"^((?:.*\.)?(?:layers|h))\.(\d+)\.")  # model.layers.3.mlp..., transformer.h.0.attn...
_HEADER_LIMIT = 100 * 2**20  # a safetensors header larger than this is not one
_FLASH = {"flash_attention_2": "is_flash_attn_2_available", "flash_attention_3": "is_flash_attn_3_available"}
GGUF_SOURCE = "gguf_source.json"  # in a GGUF file's view directory: the file, its sha256, its tensor types
_GGUF_FLOATS = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}  # GGUF float types, in --dtype auto's order


def load_failure(path: str | os.PathLike, exc: BaseException) -> DihalValueError:
    """The one-line error for a load of ``path`` that transformers (or safetensors, torch) refused."""
    return DihalValueError(f"could not load a causal LM from {path}: {type(exc).__name__}: {exc}".splitlines()[0])


def _safetensors_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint: those its index names, else ``model.safetensors``, else none."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            return sorted({directory / name for name in weight_map.values()})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DihalValueError(f"{index} is corrupt: no readable weight_map ({exc})") from exc
    single = directory / "model.safetensors"
    return [single] if single.is_file() else []


def stored_tensor_shapes(directory: str | os.PathLike) -> dict[str, tuple[int, ...]] | None:
    """The tensors a checkpoint's safetensors files hold, name -> shape, read from their headers alone (no tensor
    is loaded); ``None`` for a checkpoint without safetensors files (``pytorch_model.bin``)."""
    files = _safetensors_files(Path(directory))
    if not files:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with file.open("rb") as handle:
                size = int.from_bytes(handle.read(8), "little")
                if not 2 <= size <= min(_HEADER_LIMIT, file.stat().st_size - 8):
                    raise DihalValueError(f"{file} is corrupt: not a safetensors file (header length {size})")
                header = json.loads(handle.read(size))
            shapes.update(
                (name, tuple(int(n) for n in entry["shape"]))
                for name, entry in header.items()
                if name != "__metadata__"
            )
        except DihalError:
            raise
        except (ValueError, UnicodeDecodeError, AttributeError, KeyError, TypeError) as exc:
            raise DihalValueError(f"{file} is corrupt: not a safetensors file ({type(exc).__name__}: {exc})") from exc
    return shapes


def check_stored_shapes(
    directory: str | os.PathLike, skeleton: torch.nn.Module, shapes: Mapping, prefix: str = ""
) -> None:
    """Refuse tensors the checkpoint holds (``shapes``, from :func:`stored_tensor_shapes`) in another shape than
    ``skeleton`` (the architecture built on the meta device, which takes no memory) gives them: a config field
    larger than the weights (``hidden_size``, a width) is caught before the model is allocated."""
    wrong = [
        f"{prefix}{name} (stored {list(shapes[prefix + name])}, expected {list(tensor.shape)})"
        for name, tensor in skeleton.state_dict().items()
        if prefix + name in shapes and tuple(shapes[prefix + name]) != tuple(tensor.shape)
    ]
    if wrong:
        raise DihalValueError(
            f"the weights in {directory} do not fit the architecture its config.json describes: tensors of another "
            f"shape {_listed(wrong, 3)} (refused before allocating the model)"
        )


def check_layer_count(
    directory: str | os.PathLike, layers: object, names: Iterable[str] | None = None, field: str = "num_hidden_layers"
) -> None:
    """Refuse a config whose ``layers`` (``num_hidden_layers``) exceed the decoder layers the checkpoint's
    weights hold (the largest ``...layers.N`` / ``...h.N`` list in ``names``, default: the safetensors headers)
    before any model is built; a checkpoint whose weights name no layer list is left to the loading report."""
    names = stored_tensor_shapes(directory) if names is None else names
    if names is None or not isinstance(layers, int) or isinstance(layers, bool):
        return
    stacks: dict[str, set[int]] = {}
    for name in names:
        match = _LAYER_KEY.match(name)
        if match:
            stacks.setdefault(match.group(1), set()).add(int(match.group(2)))
    if not stacks:
        return
    stack, indices = max(stacks.items(), key=lambda item: len(item[1]))
    if layers > len(indices):
        raise DihalValueError(
            f"{directory}/config.json says {field} = {layers}, but its weights hold {len(indices)} "
            f"layers ({stack}.0..{max(indices)}); refusing to make up the others"
        )


def _listed(items: Iterable[str], limit: int = 5) -> str:
    items = sorted(items)
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def check_loading_info(directory: str | os.PathLike, info: Mapping) -> None:
    """Refuse a load whose transformers report (``output_loading_info=True``) lists tensors the checkpoint
    lacks, holds without a place, or holds in another shape: one line naming them."""
    problems = []
    if info.get("missing_keys"):
        problems.append(f"missing {_listed(info['missing_keys'])}")
    if info.get("unexpected_keys"):
        problems.append(f"unexpected {_listed(info['unexpected_keys'])}")
    if info.get("mismatched_keys"):
        shapes = [
            f"{key} (stored {list(stored)}, expected {list(wanted)})" for key, stored, wanted in info["mismatched_keys"]
        ]
        problems.append(f"of another shape {_listed(shapes, 3)}")
    if problems:
        raise DihalValueError(
            f"the weights in {directory} do not fit the architecture its config.json describes: tensors "
            + "; ".join(problems)
            + " (refused rather than filled with random values)"
        )


def check_device_map(device_map: object) -> None:
    """Refuse a ``from_pretrained(device_map=...)`` naming a device torch cannot use here (a CUDA device on a
    machine without one, a GPU index beyond the count), as :func:`~dihal_fast.common.devices.resolve_device` does."""
    from dihal_fast.common.devices import DEVICE_MAP_CHOICES, resolve_device

    if device_map is None or device_map in DEVICE_MAP_CHOICES:
        return
    values = device_map.values() if isinstance(device_map, Mapping) else [device_map]
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, str, torch.device)):
            raise DihalValueError(f"device_map {device_map!r}: {value!r} is neither a device name nor a GPU index")
        name = f"cuda:{value}" if isinstance(value, int) else str(value)
        if name in ("cpu", "disk", "meta"):
            continue
        try:
            resolve_device(name)
        except DihalError as exc:
            raise DihalValueError(f"device_map {device_map!r}: {exc}") from exc


def check_attn_implementation(name: object) -> None:
    """Refuse a FlashAttention ``attn_implementation`` where it cannot run (no CUDA device, or the package is
    missing), saying which; other names are transformers' to check."""
    from transformers import utils

    if name not in _FLASH:
        return
    if not torch.cuda.is_available():
        reason = "torch sees no CUDA device here"
    elif not getattr(utils, _FLASH[str(name)])():
        reason = "the flash-attn package for it is not installed"
    else:
        return
    raise DihalValueError(
        f"attn_implementation={name!r} needs a CUDA GPU and flash-attn ({reason}); use 'sdpa' or 'eager'"
    )


def cache_dir(*parts: str) -> Path:
    """Where dihal_fast keeps what it derives from its inputs (GGUF views, downloaded test models), ``parts``
    joined: ``$DIHAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/dihal_fast``, else ``~/.cache/dihal_fast``."""
    root = os.environ.get("DIHAL_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(root).joinpath(*([] if os.environ.get("DIHAL_CACHE_DIR") else ["dihal_fast"]), *parts)


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 (hex) of a file's bytes, read once per process for each path, size and modification time."""
    stat = os.stat(path)
    return _sha256(os.path.realpath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def is_gguf_file(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` names an existing ``.gguf`` file."""
    return path is not None and Path(path).suffix.lower() == ".gguf" and Path(path).is_file()


@dataclasses.dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF file's header says: the ``general.architecture``, the number of tensors of each GGML type,
    and the dtype ``--dtype auto`` loads it in (its float type; float32 for quantised blocks)."""

    architecture: str
    tensor_types: dict[str, int]
    dtype: str


def _gguf_package(path: Path):
    """The gguf package (and accelerate, which transformers' GGUF loading needs), or one line saying how to
    install them."""
    try:
        import accelerate  # noqa: F401
        import gguf
    except ImportError as exc:
        raise DihalValueError(f"loading {path} needs the {exc.name} package: pip install 'dihal_fast[gguf]'") from None
    return gguf


@functools.cache
def _dequantizable(type_name: str) -> bool:
    """Whether the gguf package (which transformers dequantizes with) unpacks GGML type ``type_name``."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType[type_name]
    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), np.uint8), qtype)
    except (NotImplementedError, KeyError, ValueError):
        return False
    return True


def read_gguf_header(path: Path) -> GGUFHeader:
    """The header of GGUF file ``path``, refused in one line naming the file before any weights load when the
    file is not a GGUF file, is cut short, or holds a tensor of a type transformers cannot dequantize."""
    gguf = _gguf_package(path)
    try:
        reader = gguf.GGUFReader(path)
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode()
    except (ValueError, KeyError, IndexError, OSError, UnicodeDecodeError) as exc:
        raise DihalValueError(f"{path} is not a readable GGUF file (truncated or corrupt: {exc})") from None
    end, size = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0), path.stat().st_size
    if end > size:
        raise DihalValueError(f"{path} is truncated: its tensors end at byte {end}, the file at byte {size}")
    types = [tensor.tensor_type.name for tensor in reader.tensors]
    unsupported = [f"{tensor.name} ({name})" for tensor, name in zip(reader.tensors, types) if not _dequantizable(name)]
    if unsupported:
        raise DihalValueError(
            f"{path} holds tensors of a quantisation type transformers cannot dequantize: {_listed(unsupported, 3)}"
        )
    floats = [dtype for name, dtype in _GGUF_FLOATS.items() if name in types]
    dtype = floats[0] if floats and set(types) <= set(_GGUF_FLOATS) else "float32"
    return GGUFHeader(architecture, {name: types.count(name) for name in sorted(set(types))}, dtype)


def _gguf_config(path: Path, architecture: str):
    """The transformers config of GGUF file ``path``, refused in one line unless it is a causal LM."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    except LOAD_ERRORS as exc:
        raise DihalValueError(
            f"{path} holds a {architecture!r} model, which transformers cannot read from GGUF ({exc})".splitlines()[0]
        ) from None
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise DihalValueError(f"{path} holds a {config.model_type!r} model, not a causal LM")
    return config


def gguf_view(path: str | os.PathLike) -> Path:
    """The checkpoint directory standing for GGUF file ``path`` in :func:`cache_dir` (made on first use, after
    :func:`read_gguf_header`): the config and tokenizer transformers converts from the file's metadata, and
    :data:`GGUF_SOURCE` naming the file and its sha256. The weights stay in the file (see :func:`load_whole`)."""
    from transformers import AutoTokenizer

    path = Path(path).resolve()
    sha256 = file_sha256(path)
    key = hashlib.sha256(f"{path}\n{sha256}".encode()).hexdigest()[:16]
    view = cache_dir("gguf", f"{path.stem}-{key}")
    if (view / GGUF_SOURCE).is_file():
        return view
    header = read_gguf_header(path)
    config = _gguf_config(path, header.architecture)
    config.dtype = header.dtype
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except LOAD_ERRORS as exc:
        raise DihalValueError(
            f"could not build the tokenizer of {path}: {type(exc).__name__}: {exc}".splitlines()[0]
        ) from None
    tmp = view.parent / f".{view.name}.{secrets.token_hex(8)}"  # open()'s mode, unlike mkdtemp's 0700
    tmp.mkdir(parents=True)
    try:
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        source = {"file": str(path), "sha256": sha256, "bytes": path.stat().st_size, **dataclasses.asdict(header)}
        (tmp / GGUF_SOURCE).write_text(json.dumps(source, indent=2) + "\n")
        tmp.rename(view)  # atomic; a process that made the same view first wins
    except OSError:
        if not (view / GGUF_SOURCE).is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("GGUF file %s (sha256 %s): config and tokenizer in %s", path, sha256, view)
    return view


def gguf_source(model_dir: str | os.PathLike) -> dict | None:
    """What a GGUF view directory (:func:`gguf_view`) records of its file (``file``, ``sha256``,
    ``architecture``, ``tensor_types``, ``dtype``), the file checked to be there unchanged; None for any other
    directory."""
    from dihal_fast.common.io import read_json

    marker = Path(model_dir) / GGUF_SOURCE
    if not marker.is_file():
        return None
    source = read_json(marker, "GGUF source record")
    if not Path(source["file"]).is_file():
        raise FileNotFoundError(
            f"{model_dir} stands for the GGUF file {source['file']}, which is gone; pass the file where it is now"
        )
    if file_sha256(source["file"]) != source["sha256"]:
        raise DihalValueError(
            f"{source['file']} changed since {model_dir} was made from it (sha256 {source['sha256']}); pass the "
            "file itself as --model to use its present content"
        )
    return source


def _without_quantizer(model) -> None:
    """Make a model loaded (dequantized) from a GGUF file a plain transformers model: no quantizer and no
    ``quantization_config``, so what is saved from it (a hybrid) is an ordinary checkpoint."""
    model.hf_quantizer = None
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        if hasattr(config, "quantization_config"):
            del config.quantization_config


def resolve_model_dir(path: str | os.PathLike | None) -> Path:
    """``path`` checked to be a checkpoint directory: a directory, a ``.gguf`` file (its :func:`gguf_view`), a
    shipped backbone's name (``tiny-qwen3-16l``; a directory of that name wins) or ``None`` (the default shipped
    backbone). Every command's ``--model`` goes through here."""
    path = model_location(path)
    if is_gguf_file(path):
        return gguf_view(path)
    if not path.is_dir() or not (path / "config.json").is_file():
        raise DihalValueError(f"{path} is not a Hugging Face checkpoint directory (no config.json) nor a .gguf file")
    from dihal_fast.common.json_input import parse_json

    config = parse_json((path / "config.json").read_bytes(), f"{path}/config.json")
    if not isinstance(config, dict):
        raise DihalValueError(f"{path}/config.json holds {type(config).__name__}, expected a JSON object of settings")
    return path


def load_tokenizer(path: str | os.PathLike | None):
    """The tokenizer saved in directory ``path`` (or a shipped backbone's name; ``None`` = the default one's); a
    missing pad token
    is set to EOS (and said so in the log). The one tokenizer loader of the package."""
    from transformers import AutoTokenizer

    path = model_location(path)
    if is_gguf_file(path):
        path = gguf_view(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory not found: {path}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as exc:
        raise DihalValueError(f"could not load a tokenizer from {path}: {exc}") from None
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise DihalValueError(f"the tokenizer in {path} has neither a pad nor an eos token; add a pad token")
        logger.info("tokenizer has no pad token; using eos (%r) for padding", tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def placement(device, device_map: str = "none") -> dict:
    """``from_pretrained`` keyword arguments placing a checkpoint on torch device ``device`` (resolved).

    ``device_map="none"``: the whole model on ``device``; on a GPU through accelerate when it is installed, so the
    shards load straight into GPU memory instead of being staged in host memory first. A strategy of
    :data:`~dihal_fast.common.devices.DEVICE_MAP_CHOICES` (``auto``, ``balanced``, ...): accelerate spreads the
    layers over this rank's GPUs (:func:`~dihal_fast.common.devices.rank_gpus`; on ``cpu``: the CPU alone) and
    then the rank's share of host memory, through ``max_memory`` (each rank sees all of its node's GPUs, as torchrun
    and the deepspeed launcher leave them); a model spread over several places holds ``hf_device_map``. A JSON map
    (:func:`~dihal_fast.common.devices.parse_device_map`) is passed as given, once it names only this rank's GPUs.
    """
    import torch
    from transformers.utils import is_accelerate_available

    from dihal_fast.common.devices import (
        check_map_devices,
        parse_device_map,
        rank_gpus,
        rank_max_memory,
        ranks_per_node,
    )
    from dihal_fast.common.launch import launcher_env

    spec = parse_device_map(device_map)
    if spec == "none":
        return {"device_map": {"": str(device)}} if device.type == "cuda" and is_accelerate_available() else {}
    if not is_accelerate_available():
        raise DihalValueError(f"--device-map {device_map} needs accelerate: pip install 'dihal_fast[deepspeed]'")
    if device.index is not None:
        raise DihalValueError(
            f"--device-map {device_map} spreads the model over this rank's GPUs, --device {device} pins one; pass "
            "--device cuda (or auto), or --device-map none"
        )
    import psutil  # type: ignore[import-untyped]  # an accelerate dependency

    local_ranks = ranks_per_node()
    gpus = (
        rank_gpus(torch.cuda.device_count(), launcher_env().local_rank, local_ranks) if device.type == "cuda" else None
    )
    if isinstance(spec, dict):
        check_map_devices(spec, gpus)
        return {"device_map": spec}
    # Free memory of this rank's GPUs only: querying a GPU opens a CUDA context on it, in every rank that asks.
    free: dict[int | str, int] = {gpu: torch.cuda.mem_get_info(gpu)[0] for gpu in gpus or []}
    free["cpu"] = psutil.virtual_memory().available
    return {"device_map": spec, "max_memory": rank_max_memory(free, gpus, local_ranks)}


def input_device(model) -> torch.device:
    """Where a model's inputs go: the device of its input embedding (the first device of a spread model)."""
    return model.get_input_embeddings().weight.device


def load_whole(loader, path: str | os.PathLike, **kwargs):
    """``loader.from_pretrained(path, **kwargs)`` (an Auto class or a model class) checked to have found every
    tensor it needed (:func:`check_layer_count` first, then :func:`check_loading_info`); one error otherwise.
    A ``.gguf`` file or its view directory loads from the file, every tensor dequantized (``dtype``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if is_gguf_file(path):
        path = gguf_view(path)
    source = gguf_source(path)
    check_device_map(kwargs.get("device_map"))
    check_attn_implementation(kwargs.get("attn_implementation"))
    try:
        config = AutoConfig.from_pretrained(path)
    except DihalError:
        raise
    except LOAD_ERRORS as exc:
        raise load_failure(path, exc) from exc
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    shapes = stored_tensor_shapes(path)
    if shapes is not None and not getattr(config, "checks_own_weights", False):  # (a hybrid checks its parts)
        check_layer_count(path, getattr(text_config, "num_hidden_layers", None), shapes)
        try:
            with torch.device("meta"):
                skeleton = AutoModelForCausalLM.from_config(config)
        except LOAD_ERRORS as exc:
            raise load_failure(path, exc) from exc
        check_stored_shapes(path, skeleton, shapes)
    target: str | os.PathLike = path
    if source is not None:  # transformers' GGUF loader: the file's folder and name
        target, kwargs = Path(source["file"]).parent, {**kwargs, "gguf_file": Path(source["file"]).name}
        kwargs.update(_dequantize_option())
    try:
        model, info = loader.from_pretrained(target, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    except DihalError:
        raise
    except LOAD_ERRORS as exc:
        raise load_failure(path, exc) from exc
    check_loading_info(path, info)
    if source is not None:
        _without_quantizer(model)
    return model


def _dequantize_option() -> dict:
    """``from_pretrained`` keywords that unpack every GGUF weight into a dense tensor (transformers versions that
    can keep them packed); none where every weight is unpacked anyway."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def load_causal_lm(
    path: str | os.PathLike | None,
    dtype: str = "float32",
    device: str = "cpu",
    device_map: str = "none",
    **config_options: object,
):
    """``(model, tokenizer)`` from a local checkpoint directory, in eval mode on ``device`` (``auto`` or a torch
    device) and ``dtype`` (``auto`` = the checkpoint's own; see :mod:`dihal_fast.common.devices`); ``device_map``
    spreads it over this rank's devices instead (:func:`placement`; inputs go to :func:`input_device`);
    ``config_options`` set config attributes as ``from_pretrained`` keywords (a hybrid's ``bridge_dtype``)."""
    from transformers import AutoModelForCausalLM

    from dihal_fast.common.devices import resolve_device, resolve_dtype

    if dtype != "auto" and dtype not in DTYPES:
        raise DihalValueError(f"dtype must be auto or one of {sorted(DTYPES)}, got {dtype!r}")
    device = resolve_device(str(device))
    where = placement(device, device_map)
    path = resolve_model_dir(path)
    model = load_whole(AutoModelForCausalLM, path, dtype=resolve_dtype(dtype, path), **where, **config_options)
    tokenizer = load_tokenizer(path)
    if device_map == "none":
        model = model.to(device)
    return model.eval(), tokenizer

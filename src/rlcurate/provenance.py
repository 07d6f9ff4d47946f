"""Where a result came from (issue #14): one record for training runs, audits, checkpoints and
benchmarks.

:func:`provenance` is written as ``environment.json`` of a training run (chapter 5), as the
``environment`` of an audit's ``config.json`` (chapter 4), of a tiny checkpoint's ``rlcurate.json``
(chapter 4) and of a benchmark's result file (appendix A1). Its keys::

    rlcurate, python, torch, transformers, tokenizers, numpy, scipy   versions (None: not installed)
    git_sha, git_dirty    the commit of the checkout rlcurate is imported from, and whether tracked
                          files differ from it (None for both outside a git checkout)
    platform, cpu, cores  the operating system, the processor model and its logical cores
    device, gpu           where the model ran (None: not given) and the CUDA device's name
    threads               torch's CPU threads (None when torch was never imported)
    kernels               the kernel signature (:func:`kernel_signature`): which CPU code paths torch
                          and the BLAS libraries take, so a bit-for-bit comparison knows when it applies
    strategies_from       ``RLCURATE_STRATEGIES``, only where it is set: strategies from outside the package

Versions are read from the installed packages' metadata, so nothing is imported for them; the device
and the threads are asked of torch only where the process has imported it already.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

__all__ = ["PACKAGES", "cpu_name", "git_state", "kernel_signature", "package_versions", "provenance"]

PACKAGES = ("torch", "transformers", "tokenizers", "numpy", "scipy")
"""The packages whose versions every record holds, after rlcurate and python."""

_ROOT = Path(__file__).resolve().parents[2]  # the checkout, for an editable install from src/


def package_versions(extra: Sequence[str] = ()) -> dict[str, str | None]:
    """Versions of rlcurate, python, :data:`PACKAGES` and ``extra`` (None where not installed)."""
    from importlib import metadata

    from rlcurate import __version__

    out: dict[str, str | None] = {"rlcurate": __version__, "python": platform.python_version()}
    for name in (*PACKAGES, *extra):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _git(*args: str) -> str | None:
    try:
        res = subprocess.run(["git", *args], cwd=_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def git_state() -> tuple[str | None, bool | None]:
    """``(sha, dirty)`` of the git checkout this package is imported from (``dirty``: a tracked file
    differs from the commit); ``(None, None)`` for an installed package."""
    if not (_ROOT / ".git").exists() or not (_ROOT / "src" / "rlcurate").is_dir():
        return None, None
    sha = (_git("rev-parse", "HEAD") or "").strip() or None
    if sha is None:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return sha, None if status is None else bool(status.strip())


def cpu_name() -> str:
    """The processor model (``model name`` of ``/proc/cpuinfo`` on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


_ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile")
_KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA",
               "DNNL_MAX_CPU_ISA", "OPENBLAS_CORETYPE")


def _cpu_info() -> tuple[str, list[str]]:
    vendor, flags = "unknown", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                vendor = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    except OSError:
        pass
    return vendor, flags


def kernel_signature() -> dict[str, Any]:
    """Which CPU code paths compute this process's floats (issue #26): the processor's vendor and the
    instruction-set flags its kernels choose from, torch's ATen CPU capability (what
    ``ATEN_CPU_CAPABILITY`` can lower), torch's threads, and the environment variables that hold MKL,
    oneDNN and OpenBLAS to another path. Two processes with equal signatures run the same kernels, so
    only then is a bit-for-bit comparison of their results meaningful."""
    vendor, flags = _cpu_info()
    sig: dict[str, Any] = {"vendor": vendor, "isa": [f for f in _ISA_FLAGS if f in flags],
                           "env": {k: os.environ[k] for k in _KERNEL_ENV if k in os.environ}}
    torch = sys.modules.get("torch")
    if torch is not None:
        sig["aten_capability"] = torch.backends.cpu.get_cpu_capability()
        sig["threads"] = torch.get_num_threads()
    return sig


def provenance(device: Any = None, extra_packages: Sequence[str] = ()) -> dict[str, Any]:
    """The record of where a result was computed (see the module docstring for its keys):
    package versions (:func:`package_versions`), the git commit, the machine, ``device`` (a
    ``torch.device``, ``"cpu"``, ``"cuda:0"``, a server's URL, ...) and torch's threads."""
    sha, dirty = git_state()
    record: dict[str, Any] = {**package_versions(extra_packages), "git_sha": sha, "git_dirty": dirty,
                              "platform": platform.platform(), "cpu": cpu_name(), "cores": os.cpu_count(),
                              "device": None if device is None else str(device), "gpu": None, "threads": None,
                              "kernels": kernel_signature()}
    if os.environ.get("RLCURATE_STRATEGIES"):  # strategies from outside the package (rlcurate.curation.registry)
        record["strategies_from"] = os.environ["RLCURATE_STRATEGIES"]
    torch = sys.modules.get("torch")
    if torch is not None:
        record["threads"] = torch.get_num_threads()
        if record["device"] is not None and record["device"].startswith("cuda"):
            try:
                record["gpu"] = torch.cuda.get_device_name(torch.device(record["device"]))
            except (RuntimeError, AssertionError, ValueError):  # pragma: no cover (no usable CUDA)
                pass
    return record

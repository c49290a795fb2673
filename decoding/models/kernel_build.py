"""Building the C++ kernels (torch's cpp_extension, ninja) once per machine, and which instruction set
they are built for.

`DRAFTWISE_ISA` forces a path: `auto` (the default: the best this CPU runs; `neon` on aarch64),
`avx512vnni`, `avxvnni` (AVX-VNNI on 256-bit registers), `avx2` or `portable` (no kernel of our own: torch's `_int_mm`, ATen's int4 and
attention). A path the CPU cannot run is refused with a clear message, never tried.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import platform
import shutil
import sys
from pathlib import Path

log = logging.getLogger(__name__)

ISAS = ("auto", "avx512vnni", "avxvnni", "avx2", "neon", "portable")
# what each path needs of the CPU (flags of /proc/cpuinfo; aarch64's NEON is always there)
NEEDS = {"avx512vnni": ("avx512f", "avx512bw", "avx512_vnni", "f16c", "fma"),
         "avxvnni": ("avx2", "avx_vnni", "fma", "f16c"), "avx2": ("avx2", "fma", "f16c")}


# what each path needs of the compiler beyond the CPU (AVX-VNNI: GCC 11, clang 12 and later)
COMPILER_NEEDS = {"avxvnni": "-mavxvnni"}


class IsaError(ValueError):
    """DRAFTWISE_ISA names a path this CPU cannot run, or no path at all."""


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith(("flags", "Features"))), "")
    except OSError:
        return set()
    return set(line.split(":", 1)[-1].split())


def _cpu_runs(isa: str, flags: set[str]) -> bool:
    return all(f in flags for f in NEEDS[isa]) and compiler_takes(COMPILER_NEEDS.get(isa))


@functools.lru_cache(maxsize=None)
def compiler_takes(flag: str | None) -> bool:
    """Whether the C++ compiler accepts `flag` (None: nothing asked)."""
    if flag is None:
        return True
    import subprocess

    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        return False
    try:
        return subprocess.run([cxx, flag, "-x", "c++", "-fsyntax-only", "-"], input=b"", capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _best() -> str:
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "neon"
    flags = cpu_flags()
    return next((isa for isa in NEEDS if _cpu_runs(isa, flags)), "portable")


def arm_dot_product() -> bool:
    """aarch64's dot-product extension (every Apple Silicon chip; Graviton 2 on): `asimddp` in Linux's
    flags; macOS has no /proc/cpuinfo and no Apple Silicon without it. (On macOS the build also needs
    an OpenMP for Apple's clang; without one it fails and the portable path runs: untested there.)"""
    return platform.system() == "Darwin" or "asimddp" in cpu_flags()


@functools.lru_cache(maxsize=1)
def isa() -> str:
    """The instruction set the kernels are built for: avx512vnni | avxvnni | avx2 | neon | portable."""
    wanted = os.environ.get("DRAFTWISE_ISA", "auto").strip().lower() or "auto"
    if wanted not in ISAS:
        raise IsaError(f"DRAFTWISE_ISA={wanted}: use one of {', '.join(ISAS)}")
    best = _best()
    if wanted == "auto":
        return best
    if wanted == "neon" and best != "neon":
        raise IsaError("DRAFTWISE_ISA=neon: this is not an ARM CPU")
    if wanted in NEEDS and not all(f in cpu_flags() for f in NEEDS[wanted]):
        missing = [f for f in NEEDS[wanted] if f not in cpu_flags()]
        raise IsaError(f"DRAFTWISE_ISA={wanted}: this CPU lacks {', '.join(missing)}")
    if not compiler_takes(COMPILER_NEEDS.get(wanted)):
        raise IsaError(f"DRAFTWISE_ISA={wanted}: the C++ compiler does not take {COMPILER_NEEDS[wanted]}")
    return wanted


# compiler flags for portable C++ (decoding/models/row_ops.cpp) on each path: its vectors map to
# the widest registers the path allows
VECTOR_FLAGS = {"avx512vnni": ["-mavx512f", "-mfma"], "avxvnni": ["-mavx2", "-mfma"], "avx2": ["-mavx2", "-mfma"],
                "neon": [], "portable": []}


def compiler_problem() -> str | None:
    if not (shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++") or shutil.which("clang++")):
        return "no C++ compiler to build it"
    return None


@contextlib.contextmanager
def _build_lock(where: Path):
    """One build of a kernel at a time across processes. Inside it, a `lock` file that torch's
    cpp_extension left is stale (a build killed midway): torch would wait on it forever."""
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "draftwise-build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (where / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(name: str, source: Path, cflags: list[str], what: str) -> str | None:
    """Build (the first time) and load the extension `name` from `source` into
    $DRAFTWISE_HOME/extensions; returns why it cannot run, or None when its ops are registered."""
    import torch
    from torch.utils import cpp_extension

    from decoding.models import paths

    if problem := compiler_problem():
        return problem
    where = paths.draftwise_home() / "extensions" / f"{name}-{isa()}-torch{torch.__version__}"
    if not any(where.glob("*.so")):
        log.info("building the %s kernel into %s (once per machine and torch version)", what, where)
    # ninja from the package's environment, where PATH may not reach it; PATH is put back after
    saved = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), saved])
    try:
        with _build_lock(where):
            cpp_extension.load(name, [str(source)], extra_cflags=["-O3", "-fopenmp", *cflags],
                               extra_ldflags=["-fopenmp"], build_directory=str(where),
                               is_python_module=False, verbose=False)
    except Exception as exc:  # noqa: BLE001 - a failed build costs this kernel, not the load
        log.warning("%s kernel not built (%s: %s): torch's own ops run instead", what, type(exc).__name__, exc)
        return f"build failed: {type(exc).__name__}"
    finally:
        os.environ["PATH"] = saved
    return None


def runnable() -> list[str]:
    """The paths DRAFTWISE_ISA may force on this CPU, best first."""
    if _best() == "neon":
        return ["neon", "portable"]
    flags = cpu_flags()
    return [isa for isa in NEEDS if _cpu_runs(isa, flags)] + ["portable"]


if __name__ == "__main__":  # `python -m decoding.models.kernel_build`: the paths this CPU runs (make test-isa)
    print(" ".join(runnable()))

"""Building the C++ kernels (torch's cpp_extension, ninja) once per machine and code version, and which
instruction set they are built for.

`DRAFTWISE_ISA` forces a path: `auto` (the default: the best this CPU runs; `neon` on aarch64),
`avx512vnni`, `avxvnni` (AVX-VNNI on 256-bit registers), `avx2` or `portable` (no integer kernel of
our own: torch's `_int_mm` and ATen's int4; attention on row_ops.cpp's plain C++ build). A path the
CPU cannot run is refused with a clear message, never tried.

The compiler is $CXX (else `c++`), as torch's cpp_extension takes it: GCC 11 and later and clang
build every kernel (`make test-toolchains`). A kernel that cannot be built or loaded logs one line
and torch's own ops run instead, unless DRAFTWISE_REQUIRE_KERNELS=1 (CI): then it is an error.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
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


def compiler() -> str:
    """The C++ compiler torch's cpp_extension builds with: $CXX, else `c++`."""
    return os.environ.get("CXX") or "c++"


def _compiles(cxx: str, flags: list[str], source: str = "") -> subprocess.CompletedProcess | None:
    """`cxx flags` over `source` (checked, not compiled to a file); None where it cannot be run."""
    try:
        return subprocess.run([cxx, *flags, "-x", "c++", "-fsyntax-only", "-"], input=source.encode(),
                              capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None


def compiler_takes(flag: str | None) -> bool:
    """Whether the C++ compiler accepts `flag` (None: nothing asked)."""
    return flag is None or _takes(compiler(), flag)


@functools.lru_cache(maxsize=None)
def _takes(cxx: str, flag: str) -> bool:
    done = _compiles(cxx, [flag])
    return done is not None and done.returncode == 0


# OpenMP where the compiler's runtime is torch's (GCC's libgomp; torch's Linux builds use it). Clang's
# is LLVM's libomp, beside which torch.set_num_threads was ignored: kernels built without OpenMP
# start their threads through torch's own runtime instead (decoding/kernels/parallel.h).
OPENMP_PROBE = """#include <omp.h>
#if defined(__clang__)
#error "not GCC's OpenMP runtime"
#endif
int threads() { return omp_get_max_threads(); }
"""


@functools.lru_cache(maxsize=None)
def _openmp(cxx: str) -> bool:
    done = _compiles(cxx, ["-fopenmp"], OPENMP_PROBE)
    return done is not None and done.returncode == 0


def build_flags(cflags: list[str]) -> tuple[list[str], list[str]]:
    """(compiler flags, linker flags) of a kernel built with `cflags` by this compiler.
    -ffp-contract=off: a multiply and an add stay two roundings unless the code fuses them by name,
    whatever a compiler would do of its own accord (GCC fuses across statements by default, clang
    within one), so every compiler computes a kernel's floats alike."""
    if _openmp(compiler()):
        threads, link = ["-fopenmp"], ["-fopenmp"]
    else:  # parallel.h finds torch's OpenMP runtime with dlopen (in libc from glibc 2.34, libdl before)
        threads, link = [], ["-ldl"] if platform.system() == "Linux" else []
    return ["-O3", "-ffp-contract=off", *threads, *cflags], link


def _best() -> str:
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "neon"
    flags = cpu_flags()
    return next((isa for isa in NEEDS if _cpu_runs(isa, flags)), "portable")


def arm_dot_product() -> bool:
    """aarch64's dot-product extension (every Apple Silicon chip; Graviton 2 on): `asimddp` in Linux's
    flags; macOS has no /proc/cpuinfo and no Apple Silicon without it. (On macOS Apple's clang builds
    the kernels without OpenMP, their loops on torch's threads through parallel.h: untested there.)"""
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


# compiler flags for the attention kernel (decoding/kernels/row_ops_core.h) on each path: its
# vectors map to the widest registers the path allows (AVX2: its 8-lane code); portable: plain C++
VECTOR_FLAGS = {"avx512vnni": ["-mavx512f", "-mfma"], "avxvnni": ["-mavx2", "-mfma"], "avx2": ["-mavx2", "-mfma"],
                "neon": [], "portable": ["-DDRAFTWISE_PORTABLE"]}


def vector_flags(isa: str) -> list[str]:
    """VECTOR_FLAGS[isa], and on an x86 CPU that fuses multiply-adds in hardware, -mfma for the plain
    C++ build: the compiler then inlines its std::fma calls (a tenth of the time glibc's function
    took), the same roundings either way. The build is this machine's: its folder is named by its flags."""
    if isa == "portable" and platform.machine().lower() in ("x86_64", "amd64") and {"fma", "avx"} <= cpu_flags():
        return [*VECTOR_FLAGS[isa], "-mfma"]
    return VECTOR_FLAGS[isa]


def compiler_problem() -> str | None:
    """Why no kernel can be built here (None: the compiler compiles C++)."""
    return _compiler_problem(compiler())


@functools.lru_cache(maxsize=None)
def _compiler_problem(cxx: str) -> str | None:
    named = f"CXX={cxx}" if os.environ.get("CXX") else cxx
    if not shutil.which(cxx):
        return f"no C++ compiler ({named} not found)"
    done = _compiles(cxx, [], "int main() { return 0; }\n")
    if done is None or done.returncode != 0:
        return f"{named} does not compile C++ ({'it does not run' if done is None else f'exit status {done.returncode}'})"
    return None


@functools.lru_cache(maxsize=None)
def compiler_identity(cxx: str) -> str:
    """The compiler as a build's folder is named by: its path and version (another compiler, another build)."""
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, timeout=30).stdout.decode(errors="replace")
    except (OSError, subprocess.SubprocessError):
        version = ""
    return f"{shutil.which(cxx) or cxx} {version.splitlines()[0] if version else ''}"


def required() -> bool:
    """DRAFTWISE_REQUIRE_KERNELS=1: a kernel that cannot be built or loaded is an error, not a fallback
    (CI's toolchain checks: a compiler that stopped building a kernel must fail them)."""
    return os.environ.get("DRAFTWISE_REQUIRE_KERNELS", "").strip().lower() in ("1", "true", "yes")


BUILT = "built"  # written last into a build's folder: a folder without it is not a build
KEEP_BUILDS = 3  # builds kept per kernel and ISA (other code or torch versions sharing one home)
STALE_STAGING_S = 3600  # a staging folder this old is a build whose process was killed


class BuildError(RuntimeError):
    pass


@contextlib.contextmanager
def _build_lock(lock: Path):
    """One build of a kernel's code at a time across processes: a second one waits, then finds it built."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(name: str, source: Path, cflags: list[str], what: str) -> str | None:
    """Build (the first time) and load the extension `name` from `source` into $DRAFTWISE_HOME/extensions;
    returns why it cannot run, or None when its ops are registered. A build's folder is named by a
    hash of the sources, flags and compiler, so changed code is built again, never loaded stale. It is
    built in a staging folder of its own by a child process (torch's cpp_extension and ninja) and
    renamed into place when whole, so a build killed midway leaves nothing another start could load
    or wait on. One log line says why a kernel does not run (an error under DRAFTWISE_REQUIRE_KERNELS)."""
    import torch

    if problem := compiler_problem():
        return _not_run(what, problem)
    flags, link = build_flags(cflags)
    where = build_folder(name, source, cflags)
    try:
        if not (where / BUILT).exists():
            log.info("building the %s kernel (%s) with %s into %s (once per machine, torch version, compiler and code)",
                     what, isa(), compiler(), where)
            _build_into(where, name, source, flags, link)
    except (BuildError, OSError) as exc:  # OSError: a home it cannot write, say
        return _not_run(what, f"build failed: {exc}".splitlines()[0])
    with contextlib.suppress(OSError):
        os.utime(where)  # used: eviction keeps the builds used last
    try:
        torch.ops.load_library(str(where / f"{name}.so"))
    except Exception as exc:  # noqa: BLE001 - a library that does not load is built again at the next start
        with _build_lock(where.parent / f".{where.name}.lock"), contextlib.suppress(OSError):
            (where / BUILT).unlink()
        return _not_run(what, f"load failed: {type(exc).__name__}: {exc}".splitlines()[0])
    return None


def _not_run(what: str, why: str) -> str:
    message = f"the {what} kernel ({isa()}) does not run: {why}; torch's own ops run instead"
    if required():
        raise BuildError(f"{message}, and DRAFTWISE_REQUIRE_KERNELS is set")
    log.warning("%s", message)
    return why


def build_folder(name: str, source: Path, cflags: list[str]) -> Path:
    """Where the extension `name` built from `source` with `cflags` by this compiler is kept."""
    import torch

    from decoding.home import paths

    flags, link = build_flags(cflags)
    code = _code_hash(source, [*flags, *link, compiler_identity(compiler())])
    return paths.draftwise_home() / "extensions" / f"{name}-{isa()}-torch{torch.__version__}-{code}"


def _code_hash(source: Path, flags: list[str]) -> str:
    digest = hashlib.sha256(" ".join(flags).encode())
    for path in [source, *sorted(source.parent.glob("*.h"))]:  # every header a kernel file may include
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:12]


BUILD_IN_CHILD = """import json, sys
from torch.utils import cpp_extension
name, source, where, flags, link = sys.argv[1:4] + json.loads(sys.argv[4])
cpp_extension.load(name, [source], extra_cflags=flags, extra_ldflags=link, build_directory=where,
                   is_python_module=False, verbose=True)
"""


def _build_into(where: Path, name: str, source: Path, flags: list[str], link: list[str]) -> None:
    root = where.parent
    with _build_lock(root / f".{where.name}.lock"):
        if (where / BUILT).exists():  # another process built it while this one waited
            return
        staging = Path(tempfile.mkdtemp(prefix=f".{where.name}.", dir=root))
        try:
            _build_in_child(name, source, flags, link, staging, root / f"{where.name}.build.log")
            (staging / BUILT).write_text("")
            os.chmod(staging, 0o755)  # readable by every user of the home, as a folder made by mkdir is
            shutil.rmtree(where, ignore_errors=True)  # a folder without BUILT: a failed load or an older layout
            os.rename(staging, where)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    with contextlib.suppress(OSError):  # best effort: another process may be evicting too
        _evict_other_builds(where)


def _build_in_child(name: str, source: Path, flags: list[str], link: list[str], staging: Path, log_file: Path) -> None:
    """torch's cpp_extension runs `ninja` from PATH: the child's PATH starts with this environment's
    scripts folder, where pip put ninja, without touching this process's. Its output goes to
    `log_file`; it and its compilers are stopped together if it outlives the timeout."""
    import json
    import signal

    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    with open(log_file, "w") as out:
        child = subprocess.Popen([sys.executable, "-c", BUILD_IN_CHILD, name, str(source), str(staging),
                                  json.dumps([flags, link])],
                                 env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = child.wait(timeout=1800)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            if isinstance(exc, subprocess.TimeoutExpired):
                raise BuildError(f"stopped after {exc.timeout:.0f} s (the log: {log_file})") from exc
            raise
    if code != 0:
        lines = log_file.read_text(errors="replace").splitlines()
        first_error = next((ln for ln in lines if "error:" in ln), None) or \
            next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else f"exit status {code}")
        raise BuildError(f"{first_error.strip()} (the whole log: {log_file})")
    log_file.unlink(missing_ok=True)


def _evict_other_builds(where: Path) -> None:
    """Keep the KEEP_BUILDS builds of this kernel and ISA used last (other code or torch versions
    sharing the home); remove staging folders of builds killed long ago, and the builds of the
    kernel's former name."""
    import time

    kernel = where.name.split("-torch")[0] + "-torch"
    def used(folder: Path) -> float:
        with contextlib.suppress(OSError):
            return folder.stat().st_mtime
        return 0.0  # gone meanwhile

    builds = sorted((d for d in where.parent.glob(kernel + "*") if d.is_dir() and d != where), key=used, reverse=True)
    # a build used in the last hour may be loading in another process right now
    builds = [d for d in builds[KEEP_BUILDS - 1:] if time.time() - used(d) > STALE_STAGING_S]
    stale = [d for d in where.parent.glob(".*") if d.is_dir() and time.time() - used(d) > STALE_STAGING_S]
    for old in builds + stale + list(where.parent.glob("draftwise_q4_kernel-*")):
        shutil.rmtree(old, ignore_errors=True)


def runnable() -> list[str]:
    """The paths DRAFTWISE_ISA may force on this CPU, best first."""
    if _best() == "neon":
        return ["neon", "portable"]
    flags = cpu_flags()
    return [isa for isa in NEEDS if _cpu_runs(isa, flags)] + ["portable"]


if __name__ == "__main__":  # `python -m decoding.kernels.build`: the paths this CPU runs (make test-isa)
    print(" ".join(runnable()))

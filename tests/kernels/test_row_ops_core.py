"""The kernels as this run's compiler builds them ($CXX, else c++; `make test-toolchains` runs GCC 11
and clang): every kernel source compiles for every instruction set it is written for, including the
ones this CPU cannot run; and the attention kernel's core (row_ops_core.h, no torch) gives every
build this CPU runs the same bits as its plain C++ build and the digests every build must give
(tests/kernels/row_ops_test.cpp)."""
from __future__ import annotations

import platform
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from decoding.kernels import build as kernel_build
from decoding.kernels import integer_linear, row_ops

pytestmark = pytest.mark.skipif(kernel_build.compiler_problem() is not None, reason=f"{kernel_build.compiler_problem()}")

KERNELS = Path(row_ops.__file__).parent
TEST = Path(__file__).with_name("row_ops_test.cpp")
GRID_FIT_TEST = Path(__file__).with_name("grid_fit_test.cpp")
X86 = platform.machine().lower() in ("x86_64", "amd64")


def _sources() -> list[tuple[str, Path, list[str]]]:
    """(name, source, flags) of every build the kernels have for this machine's architecture."""
    isas = ["avx512vnni", "avxvnni", "avx2", "portable"] if X86 else ["neon", "portable"]
    builds = [(f"attention {isa}", row_ops.SOURCE, kernel_build.vector_flags(isa)) for isa in isas]
    return builds + [(f"int8/int4 {isa}", *integer_linear.SOURCES[isa]) for isa in isas if isa in integer_linear.SOURCES]


@pytest.mark.parametrize("name, source, flags", _sources(), ids=[b[0] for b in _sources()])
def test_every_kernel_source_compiles_for_its_instruction_set(name, source, flags):
    from torch.utils.cpp_extension import include_paths

    cflags, _ = kernel_build.build_flags(flags)
    includes = [f"-I{p}" for p in [*include_paths(), sysconfig.get_paths()["include"]]]
    done = subprocess.run([kernel_build.compiler(), "-std=c++17", "-fsyntax-only", *cflags, *includes, str(source)],
                          capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode == 0, f"{kernel_build.compiler()} does not build the {name} kernel: {errors[:3]}"


def _core_builds() -> list[tuple[str, list[str]]]:
    """The attention core's builds this CPU runs: (name, flags)."""
    flags = kernel_build.cpu_flags()
    builds = [("plain C++", ["-DDRAFTWISE_PORTABLE"])]
    if X86 and {"avx", "fma"} <= flags:
        builds.append(("plain C++, hardware fma", ["-DDRAFTWISE_PORTABLE", "-mfma"]))
    if X86 and {"avx2", "fma"} <= flags:
        builds.append(("AVX2, 8 lanes", ["-mavx2", "-mfma"]))
    if X86 and {"avx512f", "fma"} <= flags:
        builds.append(("AVX-512, 16 lanes", ["-mavx512f", "-mfma"]))
    if platform.machine().lower() in ("aarch64", "arm64"):
        builds.append(("NEON, 16 lanes", []))
    return builds


@pytest.mark.parametrize("name, flags", _core_builds(), ids=[b[0] for b in _core_builds()])
def test_the_attention_core_gives_every_build_the_same_bits(name, flags, tmp_path):
    binary = tmp_path / "row_ops_test"
    built = subprocess.run([kernel_build.compiler(), "-O3", "-std=c++17", "-ffp-contract=off", *flags,
                            f"-I{KERNELS}", str(TEST), "-o", str(binary)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout[-2000:]
    assert " 0 of " in ran.stdout.splitlines()[-1]


@pytest.mark.parametrize("name, flags", _core_builds(), ids=[b[0] for b in _core_builds()])
def test_the_grid_fit_gives_every_build_the_same_bits(name, flags, tmp_path):
    """Packing's grid fit (grid_fit.h, no torch) against the digest every build must give: one that
    GCC 11's and 12's AVX2 vectorizers once changed (tests/kernels/grid_fit_test.cpp)."""
    binary = tmp_path / "grid_fit_test"
    built = subprocess.run([kernel_build.compiler(), "-O3", "-std=c++17", "-ffp-contract=off", *flags,
                            f"-I{KERNELS}", str(GRID_FIT_TEST), "-o", str(binary)], capture_output=True, text=True,
                           timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0 and " 0 of " in ran.stdout.splitlines()[-1], ran.stdout[-2000:]


@pytest.mark.skipif(not (X86 and {"avx2", "fma"} <= kernel_build.cpu_flags() and shutil.which("clang++")),
                    reason="needs clang++ and an x86 CPU with FMA")
def test_the_grid_fit_digest_fails_a_build_that_fuses_multiply_adds(tmp_path):
    """The test above can fail: clang with -ffp-contract=fast fuses the fit's multiply-adds, and its
    grids differ from the pinned ones (GCC's contracted builds happen to give these groups the same
    bits; the kernels build with -ffp-contract=off either way)."""
    binary = tmp_path / "grid_fit_fused"
    built = subprocess.run(["clang++", "-O3", "-std=c++17", "-mavx2", "-mfma", "-ffp-contract=fast", f"-I{KERNELS}",
                            str(GRID_FIT_TEST), "-o", str(binary)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)
    assert ran.returncode != 0 and "FAIL grid fit digest" in ran.stdout

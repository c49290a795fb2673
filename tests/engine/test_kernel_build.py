"""How a kernel is built and loaded (decoding/kernels/build.py), on a tiny extension of its own: built
in a child process into a folder named by its code and compiler, loaded from there, built again when
its code or compiler changes (the oldest builds evicted), never blocked or fooled by what a killed
build left, and this process's PATH left alone; a kernel that cannot be built says why in one log
line, or stops the load where DRAFTWISE_REQUIRE_KERNELS asks for every kernel."""
from __future__ import annotations

import os

import pytest
import torch

from decoding.kernels import build as kernel_build

pytestmark = pytest.mark.skipif(kernel_build.compiler_problem() is not None, reason="no C++ compiler")

SOURCE = """#include <torch/library.h>
#include <ATen/ATen.h>
at::Tensor {op}(const at::Tensor& x) {{ return x + {add}; }}
TORCH_LIBRARY_FRAGMENT(draftwise_build_test, m) {{ m.def("{op}(Tensor x) -> Tensor"); }}
TORCH_LIBRARY_IMPL(draftwise_build_test, CPU, m) {{ m.impl("{op}", {op}); }}
"""


def test_a_kernel_builds_once_per_code_and_loads_without_touching_path(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path / "home"))
    source = tmp_path / "src" / "tiny.cpp"
    source.parent.mkdir()
    source.write_text(SOURCE.format(op="plus_one", add=1))
    path = os.environ.get("PATH")
    extensions = tmp_path / "home" / "extensions"
    prefix = f"draftwise_build_test-{kernel_build.isa()}-torch"
    olds = [f"{prefix}{torch.__version__}-old{age}" for age in range(3)]  # builds of other code, newest first
    for age, old in enumerate(olds):
        (extensions / old).mkdir(parents=True)
        os.utime(extensions / old, (1000 - age, 1000 - age))

    assert kernel_build.build("draftwise_build_test", source, [], "test") is None
    assert torch.equal(torch.ops.draftwise_build_test.plus_one(torch.zeros(2)), torch.ones(2))
    built = [d.name for d in extensions.iterdir() if d.is_dir() and d.name not in olds]
    # the three used last are kept: this one and the two newest others
    assert sorted(d.name for d in extensions.iterdir() if d.is_dir()) == sorted(built + olds[:2])
    assert len(built) == 1 and os.environ.get("PATH") == path
    first = built

    # the same code again: loaded from its folder, not built
    monkeypatch.setattr(kernel_build, "_build_in_child", lambda *a: pytest.fail("built again"))
    assert kernel_build.build("draftwise_build_test", source, [], "test") is None
    monkeypatch.undo()
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path / "home"))

    # changed code: a new folder. A build killed midway left a folder there without its `built` mark
    # (and torch's `lock` file, which would make torch wait forever): it is built again, not loaded.
    source.write_text(SOURCE.format(op="plus_two", add=2))
    killed = kernel_build.build_folder("draftwise_build_test", source, [])
    killed.mkdir()
    (killed / "lock").write_text("")
    (killed / "draftwise_build_test.so").write_text("half a library")
    assert kernel_build.build("draftwise_build_test", source, [], "test") is None
    assert torch.equal(torch.ops.draftwise_build_test.plus_two(torch.zeros(2)), torch.full((2,), 2.0))
    second = sorted(d.name for d in extensions.iterdir() if d.is_dir())
    assert second == sorted([first[0], killed.name, olds[0]]), second
    assert os.environ.get("PATH") == path


def test_a_failed_build_says_why_and_the_load_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path / "home"))
    source = tmp_path / "broken.cpp"
    source.write_text("this is not C++\n")
    why = kernel_build.build("draftwise_build_broken", source, [], "test")
    assert why.startswith("build failed: ") and "error" in why and "broken.cpp" in why, why
    log = next((tmp_path / "home" / "extensions").glob("*.build.log"))
    assert "this is not C++" in log.read_text() or "error" in log.read_text()


def test_another_compiler_builds_its_own_and_a_failure_is_an_error_where_kernels_are_required(tmp_path, monkeypatch, caplog):
    """CI builds the kernels with each toolchain users have (make test-toolchains): each compiler's
    build is its own, never one another compiler left, and a kernel that does not build fails there
    instead of leaving torch's ops to run."""
    import shutil

    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path / "home"))
    source = tmp_path / "tiny.cpp"
    source.write_text(SOURCE.format(op="plus_three", add=3))
    first = kernel_build.build_folder("draftwise_build_test", source, [])
    wrapper = tmp_path / "bin" / "c++"  # the same compiler under another name stands in for another one
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which(kernel_build.compiler())} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    assert kernel_build.build_folder("draftwise_build_test", source, []) != first
    assert kernel_build.build("draftwise_build_test", source, [], "test") is None
    assert (kernel_build.build_folder("draftwise_build_test", source, []) / kernel_build.BUILT).exists()

    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setenv("DRAFTWISE_REQUIRE_KERNELS", "1")
    with pytest.raises(kernel_build.BuildError, match="DRAFTWISE_REQUIRE_KERNELS"):
        kernel_build.build("draftwise_build_broken", broken, [], "test")
    monkeypatch.setenv("CXX", "/bin/false")
    with pytest.raises(kernel_build.BuildError, match="CXX=/bin/false does not compile C"):
        kernel_build.build("draftwise_build_test", source, [], "test")

    monkeypatch.delenv("DRAFTWISE_REQUIRE_KERNELS")
    caplog.clear()
    with caplog.at_level("WARNING", logger="decoding.kernels.build"):
        assert kernel_build.build("draftwise_build_test", source, [], "test") == "CXX=/bin/false does not compile C++ (exit status 1)"
    assert [r.getMessage() for r in caplog.records] == [f"the test kernel ({kernel_build.isa()}) does not run: CXX=/bin/false "
                                                       "does not compile C++ (exit status 1); torch's own ops run instead"]

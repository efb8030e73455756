#!/usr/bin/env bash
# `make test`: the Makefile's test targets in four steps, scheduled on the
# cores (docs/testing.md says why). Each make it calls is echoed first; under
# `make -n test` they print their commands instead of running them.
set -euo pipefail
cd "$(dirname "$0")/.."
make=${MAKE:-make}
run() { echo "$*"; "$@"; }

# 1. The Go unit tests and the C tests beside the making of .venv: neither
#    keeps both cores busy.
run "$make" --no-print-directory -j2 --output-sync=target gounit ctest install testhooks

# 2. The one-process suite on every core. It leaves the two-rank files to
#    step 3 instead of launching torchrun for them (tests/python/_dist_util.py).
run "$make" --no-print-directory -j1 pytest PYTEST_ENV=GODDP_TESTS_TORCHRUN_LATER=1

# 3. The two-rank suite leaves about a quarter of the cores idle (its ranks
#    wait on each other and on deliberate delays): the fuzz runs and the
#    wheel's build fill them under SCHED_IDLE, which gives way at once to any
#    process that wants a core (nice 19 where chrt cannot). The suite streams
#    its output; the work beside it prints each target's when it is done.
beside=(chrt --idle 0)
"${beside[@]}" true >/dev/null 2>&1 || beside=(nice -n 19)
run "$make" --no-print-directory pytest-dist &
suite=$!
if run "${beside[@]}" "$make" --no-print-directory --output-sync=target gofuzz wheel; then beside_rc=0; else beside_rc=$?; fi
wait "$suite"
[ "$beside_rc" -eq 0 ] || exit "$beside_rc"

# 4. The wheel's user path.
run "$make" --no-print-directory -j1 test-wheel

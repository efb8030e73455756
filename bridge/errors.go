package main

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"strings"

	"github.com/goddp/goddp/planner"
)

// errOutOfMemory reports a failed C.malloc while copying a plan out.
var errOutOfMemory = errors.New("goddp: out of C memory while copying the plan")

// invalidGraph and invalidConfig build the planner's own error type so that
// the bridge's checks and the planner's map to goddp_status the same way.
func invalidGraph(format string, args ...any) error {
	return &planner.Error{Code: planner.ErrInvalidGraph, Msg: fmt.Sprintf(format, args...)}
}

func invalidConfig(format string, args ...any) error {
	return &planner.Error{Code: planner.ErrInvalidConfig, Msg: fmt.Sprintf(format, args...)}
}

// statusOf maps an error to the goddp_status the caller sees. Only
// *planner.Error carries a specific code; anything else is internal.
func statusOf(err error) C.goddp_status {
	if err == nil {
		return C.GODDP_OK
	}
	var pe *planner.Error
	if errors.As(err, &pe) {
		switch pe.Code {
		case planner.ErrInvalidConfig:
			return C.GODDP_ERR_INVALID_CONFIG
		case planner.ErrInvalidGraph:
			return C.GODDP_ERR_INVALID_GRAPH
		case planner.ErrOverflow:
			return C.GODDP_ERR_OVERFLOW
		}
	}
	return C.GODDP_ERR_INTERNAL
}

// setErrMsg hands msg to the caller as a malloc'd C string, when the caller
// asked for messages at all (err_msg may be NULL).
func setErrMsg(errMsg **C.char, msg string) {
	if errMsg != nil {
		*errMsg = C.CString(cText(msg))
	}
}

// cText is text as a NUL-terminated C string can hold it: a NUL inside
// (from a parameter or module name, say) is written \x00 rather than
// cutting the message short there.
func cText(text string) string {
	return strings.ReplaceAll(text, "\x00", `\x00`)
}

// recoverAsStatus is deferred by every export that returns a status. It must
// be the deferred function itself: recover only stops a panic when called
// directly by a deferred call.
func recoverAsStatus(status *C.goddp_status, errMsg **C.char) {
	if r := recover(); r != nil {
		*status = C.GODDP_ERR_PANIC
		setErrMsg(errMsg, panicMessage(r))
	}
}

// recoverSilently is deferred by the exports that return nothing: there is
// no channel to report on, but a panic must still not reach C.
func recoverSilently() {
	_ = recover()
}

// maxPanicFrames bounds the stack included in a panic message: enough to
// locate the bug, short enough to read in an exception.
const maxPanicFrames = 12

// panicMessage formats a recovered panic value with the stack of the code
// that panicked. It runs inside the deferred call, where the panicking
// frames are still on the stack.
func panicMessage(r any) string {
	var b strings.Builder
	fmt.Fprintf(&b, "goddp: Go panic (a bug in goddp, please report it): %v\n", r)
	pcs := make([]uintptr, 64)
	n := runtime.Callers(1, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	shown := 0
	for shown < maxPanicFrames {
		f, more := frames.Next()
		// Skip the runtime's panic machinery, this helper and the deferred
		// recover call; what remains starts at the frame that panicked.
		if !strings.HasPrefix(f.Function, "runtime.") &&
			!strings.HasSuffix(f.Function, ".panicMessage") &&
			!strings.HasSuffix(f.Function, ".recoverAsStatus") &&
			!strings.Contains(f.Function, "_cgoexp_") {
			fmt.Fprintf(&b, "  %s\n      %s:%d\n", f.Function, f.File, f.Line)
			shown++
		}
		if !more {
			break
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

//go:build goddp_testhooks

package main

// goddp_debug_panic exists only in builds with the goddp_testhooks tag (the
// Makefile's build/testhooks/ library and test extension): a shipped library
// must not offer callers a way to crash into the recovery path. The tests use
// it to prove that a Go panic comes back as GODDP_ERR_PANIC plus a message.
//
// The CFLAGS line makes csrc/goddp.h declare the prototype, so the export is
// still checked against the header like every other one.

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc -DGODDP_TESTHOOKS
#include <stdlib.h>
#include "goddp.h"
*/
import "C"

//export goddp_debug_panic
func goddp_debug_panic(errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	if errMsg != nil {
		*errMsg = nil
	}
	panicOnPurpose()
	return C.GODDP_OK
}

// panicOnPurpose is in a function of its own so that the reported stack
// shows where the panic came from.
func panicOnPurpose() {
	panic("goddp_debug_panic: deliberate panic to test recovery")
}

// callDebugPanic runs the goddp_debug_panic export for debugpanic_test.go.
func callDebugPanic() (status int, msg string) {
	var cmsg *C.char
	st := goddp_debug_panic(&cmsg)
	if cmsg != nil {
		msg = C.GoString(cmsg)
		goddp_string_free(cmsg)
	}
	return int(st), msg
}

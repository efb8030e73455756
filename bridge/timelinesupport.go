//go:build goddp_testhooks

package main

// Helpers for timeline_test.go (test files cannot use cgo; see
// testsupport.go): goddp_timeline called as C would. None of it is
// reachable from the exports.

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"

typedef const char goddp_text_in;
*/
import "C"

import "unsafe"

// callTimeline calls goddp_timeline with request; the reply comes back as
// a reportCall (textSet: *reply was non-NULL).
func callTimeline(request string) reportCall {
	in := C.CString(request)
	defer C.free(unsafe.Pointer(in))
	var out, msg *C.char
	return collectReport(goddp_timeline((*C.goddp_text_in)(in), &out, &msg), out, msg)
}

package main

// Helpers for the JSON operations' tests (test files cannot use cgo; see
// testsupport.go): each called as C would. None of it is reachable from the
// exports.

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"

typedef const char goddp_text_in;
*/
import "C"

import "unsafe"

// callTracePlans calls goddp_trace_plans with request.
func callTracePlans(request string) reportCall {
	in := C.CString(request)
	defer C.free(unsafe.Pointer(in))
	var out, msg *C.char
	return collectReport(goddp_trace_plans((*C.goddp_text_in)(in), &out, &msg), out, msg)
}

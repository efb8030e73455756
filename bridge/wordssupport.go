package main

// Helpers for words_test.go (test files cannot use cgo; see testsupport.go):
// goddp_forward_layout called as C would. None of it is reachable from the
// exports.

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"

typedef const char goddp_text_in;
*/
import "C"

import "unsafe"

// callForwardLayout calls goddp_forward_layout with request.
func callForwardLayout(request string) reportCall {
	in := C.CString(request)
	defer C.free(unsafe.Pointer(in))
	var out, msg *C.char
	return collectReport(goddp_forward_layout((*C.goddp_text_in)(in), &out, &msg), out, msg)
}

// callFollow calls goddp_follow with request.
func callFollow(request string) reportCall {
	in := C.CString(request)
	defer C.free(unsafe.Pointer(in))
	var out, msg *C.char
	return collectReport(goddp_follow((*C.goddp_text_in)(in), &out, &msg), out, msg)
}

// callPlanNotes calls goddp_plan_notes with request.
func callPlanNotes(request string) reportCall {
	in := C.CString(request)
	defer C.free(unsafe.Pointer(in))
	var out, msg *C.char
	return collectReport(goddp_plan_notes((*C.goddp_text_in)(in), &out, &msg), out, msg)
}

// callDDPRefusal calls goddp_ddp_refusal with request.
func callDDPRefusal(request string) reportCall {
	in := C.CString(request)
	defer C.free(unsafe.Pointer(in))
	var out, msg *C.char
	return collectReport(goddp_ddp_refusal((*C.goddp_text_in)(in), &out, &msg), out, msg)
}

// callRoundError calls goddp_round_error with request.
func callRoundError(request string) reportCall {
	in := C.CString(request)
	defer C.free(unsafe.Pointer(in))
	var out, msg *C.char
	return collectReport(goddp_round_error((*C.goddp_text_in)(in), &out, &msg), out, msg)
}

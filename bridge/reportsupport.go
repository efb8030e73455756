package main

// Helpers for reports_test.go (test files cannot use cgo; see
// testsupport.go): the report export called as C would.

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"

typedef const char goddp_text_in;
*/
import "C"

import "unsafe"

// reportCall is what a report export returned.
type reportCall struct {
	status    int
	text, msg string
	textSet   bool // *out was non-NULL
}

// callReport calls goddp_plan_table with doc; nullIn and nullOut pass
// NULL for the input or the output.
func callReport(doc string, nullIn, nullOut bool) reportCall {
	var in *C.char
	if !nullIn {
		in = C.CString(doc)
		defer C.free(unsafe.Pointer(in))
	}
	var out, msg *C.char
	outp := &out
	if nullOut {
		outp = nil
	}
	return collectReport(goddp_plan_table((*C.goddp_text_in)(in), outp, &msg), out, msg)
}

// collectReport turns what an export returned into a reportCall and frees
// the returned strings, as a C caller must.
func collectReport(status C.goddp_status, out, msg *C.char) reportCall {
	r := reportCall{status: int(status), textSet: out != nil}
	if out != nil {
		r.text = C.GoString(out)
		goddp_string_free(out)
	}
	if msg != nil {
		r.msg = C.GoString(msg)
		goddp_string_free(msg)
	}
	return r
}

package main

// Helpers for agree_test.go (test files cannot use cgo; see testsupport.go):
// goddp_agree called as C would. None of it is reachable from the exports.

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"

typedef const char goddp_text_in;
*/
import "C"

import "unsafe"

// callAgree calls goddp_agree with request; the verdict comes back as a
// reportCall (textSet: *verdict was non-NULL).
func callAgree(request string) reportCall {
	in := C.CString(request)
	defer C.free(unsafe.Pointer(in))
	var out, msg *C.char
	return collectReport(goddp_agree((*C.goddp_text_in)(in), &out, &msg), out, msg)
}

package main

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"

// See exports.go: cgo cannot spell const in an export's signature.
typedef const char goddp_text_in;
*/
import "C"

import "encoding/json"

// respond is the body of every export that takes text and gives text (the
// JSON operations, goddp.h): it clears the outputs, refuses
// NULL ones, and hands produce's text for the request to *out, or its
// error to *errMsg with the error's status. The export defers
// recoverAsStatus itself (recover works only in the deferred call).
func respond(name string, in *C.goddp_text_in, out, errMsg **C.char, produce func(request string) (string, error)) C.goddp_status {
	if errMsg != nil {
		*errMsg = nil
	}
	if in == nil || out == nil {
		setErrMsg(errMsg, "goddp: "+name+": request or reply is NULL")
		return C.GODDP_ERR_INVALID_CONFIG
	}
	*out = nil
	text, err := produce(C.GoString((*C.char)(in)))
	if err != nil {
		setErrMsg(errMsg, err.Error())
		return statusOf(err)
	}
	*out = C.CString(cText(text))
	return C.GODDP_OK
}

// Note [JSON operations]: some requests are nested, optional and few (a
// graph's checkpoint calls, per call a body, per body node its inputs), and
// their replies a question or a decision; such an export takes and returns
// JSON text rather than flat arrays. goddp.h and docs/planner.md document
// both shapes of each; the wire types beside each export are them.

// answer is respond for a JSON operation (Note [JSON operations]):
// produce converts the request, makes the one planner call and returns the
// reply's wire value, which goes back as JSON text (an unencodable value
// is GODDP_ERR_INTERNAL).
func answer(name string, in *C.goddp_text_in, out, errMsg **C.char, produce func(request string) (any, error)) C.goddp_status {
	return respond(name, in, out, errMsg, func(request string) (string, error) {
		value, err := produce(request)
		if err != nil {
			return "", err
		}
		text, err := json.Marshal(value)
		return string(text), err
	})
}

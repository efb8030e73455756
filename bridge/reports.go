package main

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"

// See exports.go: cgo cannot spell const in an export's signature.
typedef const char goddp_text_in;
*/
import "C"

import (
	"encoding/json"

	"github.com/goddp/goddp/planner"
)

// The reports (goddp.h, "Reports"): a JSON document in, text out. The
// export decodes, makes one call into the planner and hands the text back
// as a malloc'd C string.

//export goddp_plan_table
func goddp_plan_table(viewJSON *C.goddp_text_in, table **C.char, errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	return report("goddp_plan_table", viewJSON, table, errMsg, func(v *planner.TableView) (string, error) {
		return v.Table(), nil
	})
}

// report decodes a report's document into a T and hands render's text back
// (respond).
func report[T any](name string, in *C.goddp_text_in, out, errMsg **C.char, render func(*T) (string, error)) C.goddp_status {
	return respond(name, in, out, errMsg, func(request string) (string, error) {
		var doc T
		if err := json.Unmarshal([]byte(request), &doc); err != nil {
			return "", invalidConfig("goddp: %s: not a valid document: %v", name, err)
		}
		return render(&doc)
	})
}

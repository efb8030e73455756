package main

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"

// cgo cannot spell const in an export's signature; these typedefs let the
// exports match the header's const-qualified prototypes exactly.
typedef const goddp_graph goddp_graph_in;
typedef const goddp_config goddp_config_in;
*/
import "C"

import (
	"runtime"
	"unsafe"

	"github.com/goddp/goddp/planner"
)

//export goddp_abi_version
func goddp_abi_version() C.int32_t {
	defer recoverSilently()
	return abiVersion
}

//export goddp_set_max_procs
func goddp_set_max_procs(n C.int32_t, previous *C.int32_t) (status C.goddp_status) {
	defer recoverAsStatus(&status, nil)
	// runtime.GOMAXPROCS leaves the setting alone for n < 1 and returns the
	// previous value either way, which is exactly the ABI's query rule.
	prev := runtime.GOMAXPROCS(int(n))
	if previous != nil {
		*previous = C.int32_t(prev)
	}
	return C.GODDP_OK
}

//export goddp_plan_graph
func goddp_plan_graph(g *C.goddp_graph_in, cfg *C.goddp_config_in, out **C.goddp_plan, errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	// Outputs are cleared first so that every failure path, a recovered
	// panic included, leaves *out NULL and *err_msg either NULL or set.
	if errMsg != nil {
		*errMsg = nil
	}
	if out == nil {
		setErrMsg(errMsg, "goddp: goddp_plan_graph: out is NULL")
		return C.GODDP_ERR_INVALID_CONFIG
	}
	*out = nil

	plan, err := planFromC((*C.goddp_graph)(g), (*C.goddp_config)(cfg))
	if err != nil {
		setErrMsg(errMsg, err.Error())
		return statusOf(err)
	}
	cp, err := planToC(plan)
	if err != nil {
		setErrMsg(errMsg, err.Error())
		return statusOf(err)
	}
	*out = cp
	return C.GODDP_OK
}

// planFromC converts the inputs and makes the planner's one call
// (planner.Decide).
func planFromC(g *C.goddp_graph, cfg *C.goddp_config) (*planner.Decision, error) {
	req, err := requestFromC(g, cfg)
	if err != nil {
		return nil, err
	}
	return planner.Decide(req)
}

// requestFromC converts a goddp_graph and a goddp_config into a request.
func requestFromC(g *C.goddp_graph, cfg *C.goddp_config) (*planner.Request, error) {
	graph, err := graphFromC(g)
	if err != nil {
		return nil, err
	}
	stacks, err := stacksFromC(g)
	if err != nil {
		return nil, err
	}
	settings, err := settingsFromC(cfg)
	if err != nil {
		return nil, err
	}
	return &planner.Request{Graph: graph, Stacks: stacks, Settings: settings}, nil
}

//export goddp_plan_free
func goddp_plan_free(plan *C.goddp_plan) {
	defer recoverSilently()
	freePlan(plan)
}

//export goddp_string_free
func goddp_string_free(s *C.char) {
	defer recoverSilently()
	C.free(unsafe.Pointer(s))
}

package main

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"

typedef const char goddp_text_in;
*/
import "C"

import (
	"encoding/json"

	"github.com/goddp/goddp/planner"
)

// goddp_trace_plans takes and returns JSON text, as goddp_agree does;
// goddp.h gives both shapes, the types below are them.

type wireTracePlansRequest struct {
	Module string               `json:"module"`
	Plans  []planner.PlanRecord `json:"plans"`
}

type wireTracePlansReply struct {
	Plans []planner.TracedPlan `json:"plans"`
}

//export goddp_trace_plans
func goddp_trace_plans(request *C.goddp_text_in, reply **C.char, errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	return report("goddp_trace_plans", request, reply, errMsg, func(w *wireTracePlansRequest) (string, error) {
		plans, err := planner.TracePlansOf(w.Module, w.Plans)
		if err != nil {
			return "", err
		}
		out, err := json.Marshal(wireTracePlansReply{Plans: plans})
		return string(out), err
	})
}

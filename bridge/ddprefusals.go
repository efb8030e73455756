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

// goddp_ddp_refusal, JSON as goddp_agree: why goddp.trace, or the reducer
// rebuild, leaves a DDP module alone (Note [DDP refusals]). goddp.h gives
// both shapes.

type wireRefusalRequest struct {
	Question        string  `json:"question"`
	Flags           uint32  `json:"flags"`
	CommHooks       *int    `json:"comm_hooks"`
	BuiltinCommHook *string `json:"builtin_comm_hook"`
	LoggingError    *string `json:"logging_error"`
}

type wireRefusal struct {
	Refusal *string `json:"refusal"`
	Unread  *string `json:"unread"`
}

//export goddp_ddp_refusal
func goddp_ddp_refusal(request *C.goddp_text_in, reply **C.char, errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	return answer("goddp_ddp_refusal", request, reply, errMsg, func(text string) (any, error) {
		return ddpRefusal(text)
	})
}

// ddpRefusal converts the request, asks the planner its question and
// converts the answer.
func ddpRefusal(text string) (*wireRefusal, error) {
	var w wireRefusalRequest
	if err := json.Unmarshal([]byte(text), &w); err != nil {
		return nil, invalidConfig("goddp: goddp_ddp_refusal: the request is not valid JSON: %v", err)
	}
	d, err := ddpFlags(w.Flags, refusalFlags, "goddp_ddp_refusal: flags")
	if err != nil {
		return nil, err
	}
	switch w.Question {
	case "rebuild":
		return &wireRefusal{Refusal: planner.RebuildRefusal(d)}, nil
	case "trace":
	default:
		return nil, invalidConfig("goddp: goddp_ddp_refusal: question %q; want \"trace\" or \"rebuild\"", w.Question)
	}
	name := ""
	if w.BuiltinCommHook != nil {
		name = *w.BuiltinCommHook
	}
	if d.BuiltinCommHook != (name != "") {
		return nil, invalidConfig("goddp: goddp_ddp_refusal: GODDP_DDP_BUILTIN_COMM_HOOK is set exactly when builtin_comm_hook names the hook")
	}
	if w.CommHooks != nil && *w.CommHooks < 0 {
		return nil, invalidConfig("goddp: goddp_ddp_refusal: comm_hooks = %d; want >= 0, or null when unread", *w.CommHooks)
	}
	r := planner.TraceRefusal(&planner.TraceFacts{DDP: d, CommHooks: w.CommHooks, BuiltinCommHookName: name, LoggingError: w.LoggingError})
	out := &wireRefusal{Refusal: r.Reason}
	if r.Unread != "" {
		out.Unread = &r.Unread
	}
	return out, nil
}

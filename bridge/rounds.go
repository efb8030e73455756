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

// goddp_round_error takes and returns JSON text, as goddp_agree does;
// goddp.h gives both shapes, the types below are them.

type wireRoundGroup struct {
	Name     string  `json:"name"`
	Ranks    []int   `json:"ranks"`
	Rank     int     `json:"rank"`
	TimeoutS float64 `json:"timeout_s"`
}

type wireRound struct {
	Outcome    string         `json:"outcome"`
	GaveUp     bool           `json:"gave_up"`
	Complete   bool           `json:"complete"`
	WaitedS    float64        `json:"waited_s"`
	Statements map[int]string `json:"statements"`
}

type wireRoundRequest struct {
	Meeting    string         `json:"meeting"`
	Keeps      bool           `json:"keeps"`
	TimeoutEnv string         `json:"timeout_env"`
	Group      wireRoundGroup `json:"group"`
	Round      wireRound      `json:"round"`
}

type wireRoundReply struct {
	Error *string `json:"error"`
}

//export goddp_round_error
func goddp_round_error(request *C.goddp_text_in, reply **C.char, errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	return report("goddp_round_error", request, reply, errMsg, func(w *wireRoundRequest) (string, error) {
		g, r := w.Group, w.Round
		text, err := planner.RoundError(&planner.RoundRequest{
			Meeting: planner.Meeting(w.Meeting), Keeps: w.Keeps, TimeoutEnv: w.TimeoutEnv,
			Group:   planner.RoundGroup{Name: g.Name, Ranks: g.Ranks, Rank: g.Rank, TimeoutS: g.TimeoutS},
			Outcome: r.Outcome, GaveUp: r.GaveUp, Complete: r.Complete, WaitedS: r.WaitedS, Statements: r.Statements,
		})
		if err != nil {
			return "", err
		}
		out, err := json.Marshal(wireRoundReply{Error: text})
		return string(out), err
	})
}

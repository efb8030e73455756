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
	"bytes"
	"encoding/json"
	"io"

	"github.com/goddp/goddp/planner"
)

// goddp_timeline takes and returns JSON text (Note [JSON operations] in
// bridge/respond.go): a timeline's units are few and its cost optional, a
// table or a line; the reply is numbers and a code. goddp.h documents both
// shapes; the types below are them.

type wireAllreduceCost struct {
	LatencyNs      int64      `json:"latency_ns"`
	BytesPerSecond int64      `json:"bytes_per_second"`
	Table          [][2]int64 `json:"table"` // [bytes, ns] points
}

type wireTimelineRequest struct {
	BackwardNs       []int64           `json:"backward_ns"`
	Bytes            []int64           `json:"bytes"`
	Allreduce        wireAllreduceCost `json:"allreduce"`
	LaunchNs         int64             `json:"launch_ns"`
	SlowdownPermille int64             `json:"slowdown_permille"`
	Starts           *[]int            `json:"starts"` // null: choose the boundaries
}

type wireTimelineBucket struct {
	First   int   `json:"first"`
	End     int   `json:"end"`
	Bytes   int64 `json:"bytes"`
	ReadyNs int64 `json:"ready_ns"`
	StartNs int64 `json:"start_ns"`
	DoneNs  int64 `json:"done_ns"`
}

type wireTimeline struct {
	Buckets    []wireTimelineBucket `json:"buckets"`
	BackwardNs int64                `json:"backward_ns"`
	StepNs     int64                `json:"step_ns"`
	ExposedNs  int64                `json:"exposed_ns"`
	Search     string               `json:"search"`
}

var timelineSearches = map[planner.TimelineSearch]string{
	planner.SearchNone: "none", planner.SearchExact: "exact", planner.SearchThinned: "thinned",
}

//export goddp_timeline
func goddp_timeline(request *C.goddp_text_in, reply **C.char, errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	return answer("goddp_timeline", request, reply, errMsg, func(text string) (any, error) {
		in, starts, err := timelineRequestFromJSON(text)
		if err != nil {
			return nil, err
		}
		var tl *planner.Timeline
		if starts == nil {
			tl, err = planner.PlanTimeline(in)
		} else {
			tl, err = planner.PredictTimeline(in, *starts)
		}
		if err != nil {
			return nil, err
		}
		return timelineToWire(tl), nil
	})
}

// timelineRequestFromJSON converts the request text into the planner's
// input and the given bucket starts (nil: choose them). Unknown keys are
// refused, so that a misspelt one is not read as its zero.
func timelineRequestFromJSON(text string) (*planner.TimelineInput, *[]int, error) {
	var w wireTimelineRequest
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return nil, nil, invalidConfig("goddp: goddp_timeline: the request is not valid JSON of its shape (integers only): %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, invalidConfig("goddp: goddp_timeline: the request has text after its object")
	}
	in := &planner.TimelineInput{
		BackwardNs: w.BackwardNs, Bytes: w.Bytes,
		Allreduce: planner.AllreduceCost{LatencyNs: w.Allreduce.LatencyNs, BytesPerSecond: w.Allreduce.BytesPerSecond},
		LaunchNs:  w.LaunchNs, SlowdownPermille: w.SlowdownPermille,
	}
	for _, p := range w.Allreduce.Table {
		in.Allreduce.Table = append(in.Allreduce.Table, planner.CostPoint{Bytes: p[0], Ns: p[1]})
	}
	return in, w.Starts, nil
}

func timelineToWire(tl *planner.Timeline) *wireTimeline {
	w := &wireTimeline{
		Buckets:    make([]wireTimelineBucket, len(tl.Buckets)),
		BackwardNs: tl.BackwardNs, StepNs: tl.StepNs, ExposedNs: tl.ExposedNs,
		Search: timelineSearches[tl.Search],
	}
	for k, b := range tl.Buckets {
		w.Buckets[k] = wireTimelineBucket{First: b.First, End: b.End, Bytes: b.Bytes,
			ReadyNs: b.ReadyNs, StartNs: b.StartNs, DoneNs: b.DoneNs}
	}
	return w
}

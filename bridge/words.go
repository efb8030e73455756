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

// goddp_forward_layout takes and returns JSON text, as goddp_agree does
// (Note [Agreement as JSON]): a forward's members are few and nested, and
// each may lack a layout. goddp.h and docs/planner.md ("A forward across
// graphs") give both shapes; the types below are them.

type wireMember struct {
	Layout   *wireLayout `json:"layout"`
	Reason   *string     `json:"reason"`
	Describe string      `json:"describe"`
}

type wireForwardRequest struct {
	Members    []wireMember `json:"members"`
	ParamBytes []int64      `json:"param_bytes"`
	Build      string       `json:"build"`
}

// wireForwardInfo is what the plan records keep of the forward: the
// combined plan's fields only where CombineForward ran.
type wireForwardInfo struct {
	Graphs       []string `json:"graphs"`
	BucketGraphs *[]int   `json:"bucket_graphs,omitempty"`
	Moved        *int     `json:"moved,omitempty"`
	Dropped      *int     `json:"dropped,omitempty"`
}

type wireForwardReply struct {
	Layout  *wireLayout     `json:"layout"`
	Digest  *hex64          `json:"digest"`
	Refusal *string         `json:"refusal"`
	Info    wireForwardInfo `json:"info"`
	Note    wireLog         `json:"note"`
}

// wireLog is a planner.LogLine: "info" or "warning", and the text.
type wireLog struct {
	Level string `json:"level"`
	Text  string `json:"text"`
}

//export goddp_forward_layout
func goddp_forward_layout(request *C.goddp_text_in, reply **C.char, errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	return answer("goddp_forward_layout", request, reply, errMsg, func(text string) (any, error) {
		req, err := forwardRequestFromJSON(text)
		if err != nil {
			return nil, err
		}
		out, err := planner.PlanForward(req)
		if err != nil {
			return nil, err
		}
		return forwardReplyToWire(out), nil
	})
}

func forwardRequestFromJSON(text string) (*planner.ForwardRequest, error) {
	var w wireForwardRequest
	if err := json.Unmarshal([]byte(text), &w); err != nil {
		return nil, invalidConfig("goddp: goddp_forward_layout: the request is not valid JSON: %v", err)
	}
	req := &planner.ForwardRequest{ParamBytes: w.ParamBytes, Build: w.Build, Members: make([]planner.ForwardMember, len(w.Members))}
	for i, m := range w.Members {
		req.Members[i] = planner.ForwardMember{Reason: m.Reason, Describe: m.Describe}
		if m.Layout != nil {
			l, ok := layoutFromWire(m.Layout)
			if !ok {
				return nil, invalidConfig("goddp: goddp_forward_layout: member %d: layout order %q; want \"ready\" or \"declaration\"", i, m.Layout.Order)
			}
			req.Members[i].Layout = l
		}
	}
	return req, nil
}

func forwardReplyToWire(out *planner.ForwardOutcome) *wireForwardReply {
	w := &wireForwardReply{Digest: (*hex64)(out.Digest), Refusal: out.Refusal, Note: *logToWire(&out.Note)}
	w.Info.Graphs = out.Graphs
	if out.Layout != nil {
		w.Layout = layoutToWire(out.Layout)
	}
	if p := out.Combined; p != nil {
		graphs := make([]int, len(p.Buckets))
		for i, b := range p.Buckets {
			graphs[i] = b.Graph
		}
		w.Info.BucketGraphs, w.Info.Moved, w.Info.Dropped = &graphs, &p.Moved, &p.Dropped
	}
	return w
}

// layoutFromWire is the planner's layout of a wire layout; false for an
// order other than "ready" and "declaration".
func layoutFromWire(w *wireLayout) (*planner.Layout, bool) {
	l := &planner.Layout{Caps: w.Caps, Build: w.Build}
	switch w.Order {
	case planner.OrderReady.Name():
		l.Order = planner.OrderReady
	case planner.OrderDeclaration.Name():
		l.Order = planner.OrderDeclaration
	default:
		return nil, false
	}
	for _, b := range w.Buckets {
		l.Buckets = append(l.Buckets, planner.LayoutBucket{Positions: b})
	}
	return l, true
}

func layoutToWire(l *planner.Layout) *wireLayout {
	w := &wireLayout{Caps: l.Caps, Order: l.Order.Name(), Build: l.Build, Buckets: make([][]int32, len(l.Buckets))}
	for i, b := range l.Buckets {
		w.Buckets[i] = b.Positions
	}
	return w
}

func logToWire(l *planner.LogLine) *wireLog {
	if l == nil {
		return nil
	}
	level := "info"
	if l.Warning {
		level = "warning"
	}
	return &wireLog{Level: level, Text: l.Text}
}

// goddp_follow, JSON as goddp_agree: a later graph of a decided DDP module.

type wireFollowRequest struct {
	Action  string      `json:"action"`
	Reason  *string     `json:"reason"`
	Decided *wireLayout `json:"decided"`
	Mine    *wireLayout `json:"mine"`
	Part    *wireLayout `json:"part"`
}

type wirePlanCheck struct {
	Aligned  bool   `json:"aligned"`
	Followed string `json:"followed"`
}

type wireDDPBuckets struct {
	Aligned bool    `json:"aligned"`
	Reason  *string `json:"reason"`
}

type wireFollowing struct {
	PlanCheck  wirePlanCheck  `json:"plan_check"`
	DDPBuckets wireDDPBuckets `json:"ddp_buckets"`
	Log        *wireLog       `json:"log"`
}

//export goddp_follow
func goddp_follow(request *C.goddp_text_in, reply **C.char, errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	return answer("goddp_follow", request, reply, errMsg, func(text string) (any, error) {
		req, err := followRequestFromJSON(text)
		if err != nil {
			return nil, err
		}
		f, err := planner.Follow(req)
		if err != nil {
			return nil, err
		}
		return &wireFollowing{
			PlanCheck:  wirePlanCheck{Aligned: f.Installed, Followed: planner.Followed},
			DDPBuckets: wireDDPBuckets{Aligned: f.Aligned, Reason: f.Reason},
			Log:        logToWire(f.Log),
		}, nil
	})
}

func followRequestFromJSON(text string) (*planner.FollowRequest, error) {
	var w wireFollowRequest
	if err := json.Unmarshal([]byte(text), &w); err != nil {
		return nil, invalidConfig("goddp: goddp_follow: the request is not valid JSON: %v", err)
	}
	req := &planner.FollowRequest{Reason: w.Reason}
	switch w.Action {
	case planner.ActionInstall.String():
		req.Action = planner.ActionInstall
	case planner.ActionKeep.String():
		req.Action = planner.ActionKeep
	case planner.ActionLater.String():
		req.Action = planner.ActionLater
	default:
		return nil, invalidConfig("goddp: goddp_follow: action %q; want \"install\", \"keep\" or \"later\"", w.Action)
	}
	for _, l := range []struct {
		field string
		in    *wireLayout
		out   **planner.Layout
	}{{"decided", w.Decided, &req.Decided}, {"mine", w.Mine, &req.Mine}, {"part", w.Part, &req.Part}} {
		if l.in == nil {
			continue
		}
		layout, ok := layoutFromWire(l.in)
		if !ok {
			return nil, invalidConfig("goddp: goddp_follow: %s: layout order %q; want \"ready\" or \"declaration\"", l.field, l.in.Order)
		}
		*l.out = layout
	}
	return req, nil
}

// goddp_plan_notes, JSON as goddp_agree: the INFO lines a plan deserves.

type wirePlanNotesRequest struct {
	Mode           string  `json:"mode"`
	AlignRequested bool    `json:"align_requested"`
	DDPBucketOrder string  `json:"ddp_bucket_order"`
	Aligned        bool    `json:"aligned"`
	CapsOrder      string  `json:"caps_order"`
	Alignment      string  `json:"alignment"`
	MergedCuts     int     `json:"merged_cuts"`
	NumPieces      int     `json:"num_pieces"`
	NotAligned     *string `json:"not_aligned"`
	StandIn        bool    `json:"stand_in"`
	PartOfForward  bool    `json:"part_of_forward"`
	Frame          string  `json:"frame"`
}

type wirePlanNote struct {
	Text string `json:"text"`
	Once bool   `json:"once"`
}

type wirePlanNotes struct {
	Settings *string        `json:"settings"`
	Notes    []wirePlanNote `json:"notes"`
}

//export goddp_plan_notes
func goddp_plan_notes(request *C.goddp_text_in, reply **C.char, errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	return answer("goddp_plan_notes", request, reply, errMsg, func(text string) (any, error) {
		req, err := planNotesRequestFromJSON(text)
		if err != nil {
			return nil, err
		}
		notes := planner.NotesFor(req)
		w := wirePlanNotes{Notes: make([]wirePlanNote, len(notes.Notes))}
		if notes.Settings != "" {
			w.Settings = &notes.Settings
		}
		for i, n := range notes.Notes {
			w.Notes[i] = wirePlanNote{Text: n.Text, Once: n.Once}
		}
		return &w, nil
	})
}

func planNotesRequestFromJSON(text string) (*planner.PlanNotesRequest, error) {
	var w wirePlanNotesRequest
	if err := json.Unmarshal([]byte(text), &w); err != nil {
		return nil, invalidConfig("goddp: goddp_plan_notes: the request is not valid JSON: %v", err)
	}
	req := &planner.PlanNotesRequest{
		AlignRequested: w.AlignRequested, Aligned: w.Aligned, Alignment: w.Alignment, MergedCuts: w.MergedCuts,
		NumPieces: w.NumPieces, NotAligned: w.NotAligned, StandIn: w.StandIn, PartOfForward: w.PartOfForward, Frame: w.Frame,
	}
	switch w.Mode {
	case planner.ModeDDP.String():
		req.Mode = planner.ModeDDP
	case planner.ModeTorch.String():
		req.Mode = planner.ModeTorch
	default:
		return nil, invalidConfig("goddp: goddp_plan_notes: mode %q; want \"ddp\" or \"torch\"", w.Mode)
	}
	for _, o := range []struct {
		field, name string
		out         *planner.BucketOrder
	}{{"ddp_bucket_order", w.DDPBucketOrder, &req.DDPBucketOrder}, {"caps_order", w.CapsOrder, &req.CapsOrder}} {
		switch o.name {
		case planner.OrderReady.Name():
			*o.out = planner.OrderReady
		case planner.OrderDeclaration.Name():
			*o.out = planner.OrderDeclaration
		default:
			return nil, invalidConfig("goddp: goddp_plan_notes: %s %q; want \"ready\" or \"declaration\"", o.field, o.name)
		}
	}
	return req, nil
}

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

// goddp_checkpoint_split takes and returns JSON text (Note [JSON operations]
// in bridge/respond.go): a graph's checkpoint calls are few, their facts
// nested (per call a body, per body node its inputs) and the reply a
// question or a decision, a shape worse as a struct. goddp.h and docs/planner.md ("Checkpoint
// regions") document both shapes; the types below are them. The reply is
// codes and numbers; the shim words them.

type wireBodyNode struct {
	Kind        string  `json:"kind"`
	Block       int32   `json:"block"`
	Inputs      []int32 `json:"inputs"`
	Returned    bool    `json:"returned"`
	Writes      int32   `json:"writes"`
	Carries     bool    `json:"carries"`
	Random      bool    `json:"random"`
	StateChange bool    `json:"state_change"`
	Nested      bool    `json:"nested"`
}

// UnmarshalJSON reads a node whose absent block and writes mean none (-1).
func (n *wireBodyNode) UnmarshalJSON(b []byte) error {
	type plain wireBodyNode
	p := plain{Block: -1, Writes: -1}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*n = wireBodyNode(p)
	return nil
}

type wireBodyBuckets struct {
	Pieces     []int32 `json:"pieces"`
	ParamBytes int64   `json:"param_bytes"`
	CapBytes   int64   `json:"cap_bytes"`
	Buckets    int     `json:"buckets"`
	Regions    bool    `json:"regions"`
}

type wireCheckpointCall struct {
	Name           string           `json:"name"`
	Nodes          []wireBodyNode   `json:"nodes"`
	IndexedOnly    bool             `json:"indexed_only"`
	PolicyFunction bool             `json:"policy_function"`
	Buckets        *wireBodyBuckets `json:"buckets"`
}

type wireSplitRequest struct {
	Calls          []wireCheckpointCall `json:"calls"`
	BucketSplits   bool                 `json:"bucket_splits"`
	CutAtBlocks    *bool                `json:"cut_at_blocks"`
	BucketsPlanned bool                 `json:"buckets_planned"`
}

type wireRegion struct {
	Inputs  []int32 `json:"inputs"`
	Outputs []int32 `json:"outputs"`
}

type wireSplit struct {
	Boundary    string       `json:"boundary"`
	Blocks      int          `json:"blocks"`
	NodeRegions []int32      `json:"node_regions"`
	Regions     []wireRegion `json:"regions"`
	Code        string       `json:"code"`
	Node        int32        `json:"node"`
	Region      int          `json:"region"`
}

type wireSplitReply struct {
	Ask         string      `json:"ask"`
	PlanBuckets []int       `json:"plan_buckets"`
	Calls       []wireSplit `json:"calls"`
	Said        []int       `json:"said"`
}

var bodyNodeKinds = map[string]planner.BodyNodeKind{
	"placeholder": planner.BodyPlaceholder, "get_attr": planner.BodyGetAttr,
	"compute": planner.BodyCompute, "output": planner.BodyOutput,
}

//export goddp_checkpoint_split
func goddp_checkpoint_split(request *C.goddp_text_in, reply **C.char, errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	return answer("goddp_checkpoint_split", request, reply, errMsg, func(text string) (any, error) {
		req, err := splitRequestFromJSON(text)
		if err != nil {
			return nil, err
		}
		r, err := planner.SplitCheckpoints(req)
		if err != nil {
			return nil, err
		}
		return splitReplyToWire(r), nil
	})
}

// splitRequestFromJSON converts the request text into the planner's types.
func splitRequestFromJSON(text string) (*planner.SplitRequest, error) {
	var w wireSplitRequest
	if err := json.Unmarshal([]byte(text), &w); err != nil {
		return nil, invalidConfig("goddp: goddp_checkpoint_split: the request is not valid JSON: %v", err)
	}
	req := &planner.SplitRequest{
		BucketSplits: w.BucketSplits, CutAtBlocks: w.CutAtBlocks, BucketsPlanned: w.BucketsPlanned,
		Calls: make([]planner.CheckpointCall, len(w.Calls)),
	}
	for i, wc := range w.Calls {
		c := &req.Calls[i]
		*c = planner.CheckpointCall{
			Name: wc.Name, IndexedOnly: wc.IndexedOnly, PolicyFunction: wc.PolicyFunction,
			Nodes: make([]planner.BodyNode, len(wc.Nodes)),
		}
		for j, wn := range wc.Nodes {
			kind, ok := bodyNodeKinds[wn.Kind]
			if !ok {
				return nil, invalidConfig("goddp: goddp_checkpoint_split: call %d, node %d: kind %q; want \"placeholder\", \"get_attr\", \"compute\" or \"output\"", i, j, wn.Kind)
			}
			c.Nodes[j] = planner.BodyNode{
				Kind: kind, Block: wn.Block, Inputs: wn.Inputs, Returned: wn.Returned, Writes: wn.Writes,
				Carries: wn.Carries, Random: wn.Random, StateChange: wn.StateChange, Nested: wn.Nested,
			}
		}
		if b := wc.Buckets; b != nil {
			c.Buckets = &planner.BodyBuckets{
				Pieces: b.Pieces, ParamBytes: b.ParamBytes, CapBytes: b.CapBytes, Buckets: b.Buckets, Regions: b.Regions,
			}
		}
	}
	return req, nil
}

func splitReplyToWire(r *planner.SplitReply) *wireSplitReply {
	w := &wireSplitReply{Ask: r.Ask.String(), PlanBuckets: r.PlanBuckets, Calls: make([]wireSplit, len(r.Calls)), Said: r.Said}
	if w.PlanBuckets == nil {
		w.PlanBuckets = []int{}
	}
	if w.Said == nil {
		w.Said = []int{}
	}
	for i, s := range r.Calls {
		ws := wireSplit{
			Boundary: s.Boundary, Blocks: s.Blocks, NodeRegions: s.NodeRegion,
			Code: s.Code.String(), Node: s.Node, Region: s.Region,
		}
		if s.NodeRegion != nil {
			ws.Regions = make([]wireRegion, len(s.Regions))
			for k, reg := range s.Regions {
				ws.Regions[k] = wireRegion{Inputs: nonNil(reg.Inputs), Outputs: reg.Outputs}
			}
		}
		w.Calls[i] = ws
	}
	return w
}

func nonNil(xs []int32) []int32 {
	if xs == nil {
		return []int32{}
	}
	return xs
}

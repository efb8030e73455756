//go:build goddp_testhooks

package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A body x -> relu (block 0) -> neg, sin (block 1), as the shim writes it.
const ckptBody = `[
 {"kind": "placeholder", "inputs": [], "carries": true},
 {"kind": "compute", "block": 0, "inputs": [0], "carries": true},
 {"kind": "compute", "block": 1, "inputs": [1], "carries": true},
 {"kind": "compute", "block": 1, "inputs": [2], "returned": true, "carries": true},
 {"kind": "output", "inputs": [3]}]`

func TestCheckpointSplitThroughC(t *testing.T) {
	got := callCheckpointSplit(`{"calls": [{"name": "checkpoint", "indexed_only": true, "nodes": ` + ckptBody + `}]}`)
	require.Equal(t, statusOK, got.status, got.msg)
	var reply struct {
		Ask   string `json:"ask"`
		Said  []int  `json:"said"`
		Calls []struct {
			Boundary    string  `json:"boundary"`
			NodeRegions []int32 `json:"node_regions"`
			Regions     []struct {
				Inputs  []int32 `json:"inputs"`
				Outputs []int32 `json:"outputs"`
			} `json:"regions"`
			Code   string `json:"code"`
			Node   int32  `json:"node"`
			Region int    `json:"region"`
		} `json:"calls"`
	}
	require.NoError(t, json.Unmarshal([]byte(got.text), &reply), got.text)
	assert.Equal(t, "", reply.Ask)
	assert.Equal(t, []int{0}, reply.Said)
	require.Len(t, reply.Calls, 1)
	c := reply.Calls[0]
	assert.Equal(t, "block", c.Boundary)
	assert.Equal(t, []int32{-1, 0, 1, 1, -1}, c.NodeRegions, "an absent block is -1")
	require.Len(t, c.Regions, 2)
	assert.Equal(t, []int32{0}, c.Regions[0].Inputs)
	assert.Equal(t, []int32{3}, c.Regions[1].Outputs)
	assert.Equal(t, "", c.Code)
	assert.Equal(t, []int{-1, -1}, []int{int(c.Node), c.Region}, "a split names no node or region")

	// An absent "carries" is false: a value nobody vouched for keeps it whole.
	got = callCheckpointSplit(`{"calls": [{"name": "c", "indexed_only": true, "nodes": [
	 {"kind": "placeholder"}, {"kind": "compute", "block": 0, "inputs": [0]},
	 {"kind": "compute", "block": 1, "inputs": [1], "returned": true, "carries": true}, {"kind": "output", "inputs": [2]}]}]}`)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.Contains(t, got.text, `"code":"not_carried","node":1,"region":-1`, "the value that would cross")

	// The questions: the outer graph's block runs, then the bodies to plan.
	one := `{"name": "c", "indexed_only": true, "nodes": [{"kind": "placeholder"}, {"kind": "compute", "inputs": [0], "returned": true, "carries": true}, {"kind": "output", "inputs": [1]}]`
	got = callCheckpointSplit(`{"calls": [` + one + `}], "bucket_splits": true}`)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.Contains(t, got.text, `"ask":"cut_at_blocks"`)
	got = callCheckpointSplit(`{"calls": [` + one + `}], "bucket_splits": true, "cut_at_blocks": false}`)
	assert.Contains(t, got.text, `"ask":"buckets","plan_buckets":[0]`)
	got = callCheckpointSplit(`{"calls": [` + one + `, "buckets": {"pieces": [-1, 0, -1], "param_bytes": 9, "cap_bytes": 4, "buckets": 3, "regions": true}}],
	 "bucket_splits": true, "cut_at_blocks": false, "buckets_planned": true}`)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.Contains(t, got.text, `"boundary":"bucket"`)
	assert.Contains(t, got.text, `"node_regions":[-1,0,-1]`)
	assert.Contains(t, got.text, `"said":[0]`)
}

// TestCheckpointSplitRejectsBadRequests: a request the shim could not have
// written is an error with a message, and no reply is handed out.
func TestCheckpointSplitRejectsBadRequests(t *testing.T) {
	for _, tc := range []struct {
		request, want string
		status        int
	}{
		{`[1]`, "not valid JSON", statusInvalidConfig},
		{`{"calls": [{"name": "c", "nodes": [{"kind": "loop"}]}]}`, `kind "loop"`, statusInvalidConfig},
		{`{"calls": [{"name": "c", "nodes": [{"kind": "placeholder"}]}]}`, "must end with its output node", statusInvalidGraph},
		{`{"calls": [{"name": "c", "nodes": [{"kind": "compute", "inputs": [1]}, {"kind": "output"}]}]}`, "does not come before it", statusInvalidGraph},
	} {
		got := callCheckpointSplit(tc.request)
		assert.Equal(t, tc.status, got.status, tc.request)
		assert.Contains(t, got.msg, tc.want, tc.request)
		assert.False(t, got.textSet, tc.request)
	}
}

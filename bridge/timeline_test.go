//go:build goddp_testhooks

package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The hand-worked input of planner.TestTimelineByHand: three units of
// 10 ns, 1 ns a byte, 2 ns latency, 1 ns launch.
const timelineByHand = `"backward_ns": [10, 10, 10], "bytes": [20, 5, 30],
 "allreduce": {"latency_ns": 2, "bytes_per_second": 1000000000}, "launch_ns": 1, "slowdown_permille": 1000`

func TestTimelineThroughC(t *testing.T) {
	var reply struct {
		Buckets []struct {
			First   int   `json:"first"`
			End     int   `json:"end"`
			Bytes   int64 `json:"bytes"`
			ReadyNs int64 `json:"ready_ns"`
			StartNs int64 `json:"start_ns"`
			DoneNs  int64 `json:"done_ns"`
		} `json:"buckets"`
		BackwardNs int64  `json:"backward_ns"`
		StepNs     int64  `json:"step_ns"`
		ExposedNs  int64  `json:"exposed_ns"`
		Search     string `json:"search"`
	}
	got := callTimeline(`{` + timelineByHand + `}`)
	require.Equal(t, statusOK, got.status, got.msg)
	require.NoError(t, json.Unmarshal([]byte(got.text), &reply), got.text)
	assert.Equal(t, "exact", reply.Search)
	assert.Equal(t, []int64{30, 71, 41}, []int64{reply.BackwardNs, reply.StepNs, reply.ExposedNs})
	require.Len(t, reply.Buckets, 2)
	assert.Equal(t, []int{0, 1, 1, 3}, []int{reply.Buckets[0].First, reply.Buckets[0].End, reply.Buckets[1].First, reply.Buckets[1].End})
	assert.Equal(t, []int64{35, 30, 34, 71}, []int64{reply.Buckets[1].Bytes, reply.Buckets[1].ReadyNs, reply.Buckets[1].StartNs, reply.Buckets[1].DoneNs})

	got = callTimeline(`{` + timelineByHand + `, "starts": [1, 2]}`)
	require.Equal(t, statusOK, got.status, got.msg)
	require.NoError(t, json.Unmarshal([]byte(got.text), &reply), got.text)
	assert.Equal(t, "none", reply.Search)
	assert.Equal(t, int64(74), reply.StepNs)
	assert.Len(t, reply.Buckets, 3)

	got = callTimeline(`{"backward_ns": [5], "bytes": [100], "allreduce": {"table": [[0, 10], [100, 30]]}, "slowdown_permille": 1000}`)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.Contains(t, got.text, `"step_ns":35,`, "ready at 5, 30 ns by the table")
}

func TestTimelineRefusals(t *testing.T) {
	for _, tc := range []struct {
		request, substr string
		status          int
	}{
		{`[1]`, "not valid JSON", statusInvalidConfig},
		{`{` + timelineByHand + `} {}`, "text after", statusInvalidConfig},
		{`{` + timelineByHand + `, "launch": 3}`, `unknown field "launch"`, statusInvalidConfig},
		{`{"backward_ns": [NaN], "bytes": [1]}`, "not valid JSON", statusInvalidConfig},
		{`{"backward_ns": [1.5], "bytes": [1]}`, "integers only", statusInvalidConfig},
		{`{"backward_ns": [0], "bytes": [1], "allreduce": {"bytes_per_second": 1}, "slowdown_permille": 1000}`, "backward duration 0", statusInvalidConfig},
		{`{"backward_ns": [-4], "bytes": [1], "allreduce": {"bytes_per_second": 1}, "slowdown_permille": 1000}`, "backward duration -4", statusInvalidConfig},
		{`{"backward_ns": [1], "bytes": [1], "allreduce": {"latency_ns": 5}, "slowdown_permille": 1000}`, "bandwidth 0", statusInvalidConfig},
		{`{"backward_ns": [1], "bytes": [1], "allreduce": {"bytes_per_second": 1}}`, "slowdown 0 permille", statusInvalidConfig},
		{`{"backward_ns": [], "bytes": []}`, "at least one unit", statusInvalidConfig},
		{`{` + timelineByHand + `, "starts": [3]}`, "bucket start 0 is 3", statusInvalidConfig},
		{`{"backward_ns": [4611686018427387904], "bytes": [1], "allreduce": {"bytes_per_second": 1}, "slowdown_permille": 1000}`, "at most", statusOverflow},
	} {
		got := callTimeline(tc.request)
		assert.Equal(t, tc.status, got.status, tc.request)
		assert.Contains(t, got.msg, tc.substr, tc.request)
		assert.False(t, got.textSet, "no reply on error: %s", tc.request)
	}
}

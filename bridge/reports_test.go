package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goddp/goddp/planner"
)

// TestPlanTableThroughC: the export renders what the planner renders for
// the view it decodes, under the record's names.
func TestPlanTableThroughC(t *testing.T) {
	doc := `{"fingerprint": 18446744073709551615, "mode": "ddp", "num_pieces": 2,
		"caps": {"bucket_cap_bytes": 1048576, "first_bucket_cap_bytes": 524288, "bucket_caps_bytes": [],
		         "max_pieces": null, "align_buckets": true, "bucket_order": "ready"},
		"buckets": [{"index": 0, "bytes": 2048, "param_names": ["b"], "piece": 1, "extended": false},
		            {"index": 1, "bytes": 4096, "param_names": ["a", "c"], "piece": 0, "extended": true}],
		"alignment": "ready-order caps", "merged_cuts": 0, "same_as": [0, 0], "eager": []}`
	var v planner.TableView
	require.NoError(t, json.Unmarshal([]byte(doc), &v))
	got := callReport(true, doc, false, false)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.Equal(t, v.Table(), got.text)
	assert.Contains(t, got.text, "fingerprint=ffffffffffffffff pieces=2 buckets=2")
	assert.Contains(t, got.text, "distinct pieces=1 reused=1")
	assert.Empty(t, got.msg)
}

func TestTraceReportThroughC(t *testing.T) {
	doc := `{"module": "M", "rank": 0, "ranks": [0, 1], "comm_hook": "h", "steps": [
		{"start_seen": true, "compute_end_s": 1.0, "finalized_s": null,
		 "buckets": [{"index": 0, "bytes": 8, "params": 1, "param_names": ["w"], "launch_s": 0.5, "done_s": 1.5}]}]}`
	got := callReport(false, doc, false, false)
	require.Equal(t, statusOK, got.status, got.msg)
	var rep planner.TraceReport
	require.NoError(t, json.Unmarshal([]byte(got.text), &rep))
	require.Len(t, rep.StepStats, 1)
	assert.Equal(t, 0.5, rep.StepStats[0].ExposedS)
	assert.Equal(t, 0, rep.MedianStep)
	assert.Contains(t, rep.Summary, "goddp.trace: M, rank 0 of DDP ranks [0, 1], 1 step(s), comm hook: h")
}

// TestReportsRejectBadInput: a document that is not the object, NULL
// pointers, and figures JSON cannot hold are clear errors, and nothing is
// handed out with them.
func TestReportsRejectBadInput(t *testing.T) {
	for _, table := range []bool{true, false} {
		for _, doc := range []string{"", "[1, 2]", `{"num_pieces": "three"}`, `{"steps": [{"buckets": [{"launch_s": "x"}]}]}`, "{"} {
			got := callReport(table, doc, false, false)
			if doc == `{"num_pieces": "three"}` && !table {
				continue // a key the trace report does not read
			}
			if doc == `{"steps": [{"buckets": [{"launch_s": "x"}]}]}` && table {
				continue
			}
			assert.Equal(t, statusInvalidConfig, got.status, "table=%t %q", table, doc)
			assert.Contains(t, got.msg, "not a valid document", "table=%t %q", table, doc)
			assert.False(t, got.textSet)
		}
		for _, nulls := range [][2]bool{{true, false}, {false, true}} {
			got := callReport(table, "{}", nulls[0], nulls[1])
			assert.Equal(t, statusInvalidConfig, got.status)
			assert.Contains(t, got.msg, "is NULL")
			assert.False(t, got.textSet)
		}
	}
	// Times whose differences overflow: the head start is infinite.
	got := callReport(false, `{"steps": [{"compute_end_s": 1.7e308, "buckets": [{"bytes": 1, "launch_s": -1.7e308, "done_s": 0}]}]}`, false, false)
	assert.Equal(t, statusInvalidConfig, got.status)
	assert.Contains(t, got.msg, "goddp_trace_report")
	assert.False(t, got.textSet)
}

// TestPlanTableKeepsNamesWithNUL: a NUL in a parameter name does not cut
// the table short on its way through C (the planner writes it \x00).
func TestPlanTableKeepsNamesWithNUL(t *testing.T) {
	doc := `{"fingerprint": 1, "mode": "ddp", "num_pieces": 1, "caps": {},
		"buckets": [{"index": 0, "bytes": 1, "param_names": ["c\u0000d", "after"], "piece": 0}], "alignment": "none"}`
	got := callReport(true, doc, false, false)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.Contains(t, got.text, `c\x00d`)
	assert.True(t, strings.HasSuffix(got.text, "after"), got.text)
}

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
	got := callReport(doc, false, false)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.Equal(t, v.Table(), got.text)
	assert.Contains(t, got.text, "fingerprint=ffffffffffffffff pieces=2 buckets=2")
	assert.Contains(t, got.text, "distinct pieces=1 reused=1")
	assert.Empty(t, got.msg)
}

// TestReportsRejectBadInput: a document that is not the object and NULL
// pointers are clear errors, and nothing is handed out with them.
func TestReportsRejectBadInput(t *testing.T) {
	for _, doc := range []string{"", "[1, 2]", `{"num_pieces": "three"}`, "{"} {
		got := callReport(doc, false, false)
		assert.Equal(t, statusInvalidConfig, got.status, "%q", doc)
		assert.Contains(t, got.msg, "not a valid document", "%q", doc)
		assert.False(t, got.textSet)
	}
	for _, nulls := range [][2]bool{{true, false}, {false, true}} {
		got := callReport("{}", nulls[0], nulls[1])
		assert.Equal(t, statusInvalidConfig, got.status)
		assert.Contains(t, got.msg, "is NULL")
		assert.False(t, got.textSet)
	}
}

// TestPlanTableKeepsNamesWithNUL: a NUL in a parameter name does not cut
// the table short on its way through C (the planner writes it \x00).
func TestPlanTableKeepsNamesWithNUL(t *testing.T) {
	doc := `{"fingerprint": 1, "mode": "ddp", "num_pieces": 1, "caps": {},
		"buckets": [{"index": 0, "bytes": 1, "param_names": ["c\u0000d", "after"], "piece": 0}], "alignment": "none"}`
	got := callReport(doc, false, false)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.Contains(t, got.text, `c\x00d`)
	assert.True(t, strings.HasSuffix(got.text, "after"), got.text)
}

package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestForwardLayoutThroughC(t *testing.T) {
	got := callForwardLayout(`{"members": [
		{"layout": {"buckets": [[1], [0]], "caps": [1, 1], "order": "ready", "build": "x"}, "reason": null, "describe": "g0"},
		{"layout": {"buckets": [[2, 0]], "caps": [1], "order": "ready", "build": "x"}, "reason": null, "describe": "g1"}],
		"param_bytes": [4, 4, 8], "build": "b"}`)
	require.Equal(t, statusOK, got.status, got.msg)
	var reply map[string]any
	require.NoError(t, json.Unmarshal([]byte(got.text), &reply))
	assert.Equal(t, map[string]any{"buckets": []any{[]any{2.0}, []any{1.0}, []any{0.0}}, "caps": []any{8.0, 4.0, 4.0}, "order": "ready", "build": "b"}, reply["layout"])
	assert.Len(t, reply["digest"], 16)
	assert.Nil(t, reply["refusal"])
	assert.Equal(t, map[string]any{"graphs": []any{"g0", "g1"}, "bucket_graphs": []any{1.0, 0.0, 0.0}, "moved": 1.0, "dropped": 0.0}, reply["info"])
	assert.Equal(t, "info", reply["note"].(map[string]any)["level"])
}

// TestForwardLayoutRefusal: a refused forward has no layout and keeps only
// the graphs in its info.
func TestForwardLayoutRefusal(t *testing.T) {
	got := callForwardLayout(`{"members": [{"layout": null, "reason": "no plan", "describe": "a graph"}], "param_bytes": [4], "build": "b"}`)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.JSONEq(t, `{"layout": null, "digest": null, "refusal": "a graph of the forward has no layout to combine (a graph: no plan)",
		"info": {"graphs": ["a graph"]},
		"note": {"level": "info", "text": "goddp: planning the 1 graph(s) of this DDP module's first training forward together: a graph; no layout: a graph of the forward has no layout to combine (a graph: no plan)"}}`, got.text)
}

func TestForwardLayoutRejectsBadRequests(t *testing.T) {
	for _, tc := range []struct{ request, want string }{
		{`[1]`, "not valid JSON"},
		{`{"members": [{"layout": {"buckets": [[0]], "caps": [1], "order": "sideways", "build": "x"}}]}`, `member 0: layout order "sideways"`},
	} {
		got := callForwardLayout(tc.request)
		assert.Equal(t, statusInvalidConfig, got.status, tc.request)
		assert.Contains(t, got.msg, tc.want, tc.request)
		assert.False(t, got.textSet, tc.request)
	}
}

// TestAgreeLogThroughC: with its group named, the verdict carries its line.
func TestAgreeLogThroughC(t *testing.T) {
	s := agreeStatement(t, 4)
	got := callAgree(`{"statements": {"0": ` + s + `}, "may_defer": true, "group": {"name": "pg", "size": 1}}`)
	require.Equal(t, statusOK, got.status, got.msg)
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(got.text), &v))
	assert.Equal(t, map[string]any{"level": "info", "text": "goddp: DDP's 1 buckets now close at piece boundaries on all 1 rank(s) of process group 'pg' (per-bucket caps [4] bytes)"}, v["log"])
	got = callAgree(`{"statements": {"0": ` + s + `}, "may_defer": true}`)
	var plain map[string]any
	require.NoError(t, json.Unmarshal([]byte(got.text), &plain))
	assert.NotContains(t, plain, "log")
}

func TestFollowThroughC(t *testing.T) {
	layout := `{"buckets": [[0]], "caps": [4], "order": "ready", "build": "b"}`
	got := callFollow(`{"action": "install", "reason": null, "decided": ` + layout + `, "mine": ` + layout + `, "part": null}`)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.JSONEq(t, `{"plan_check": {"aligned": true, "followed": "the decision of the module's first training call"},
		"ddp_buckets": {"aligned": true, "reason": null}, "log": null}`, got.text)
	got = callFollow(`{"action": "install", "decided": ` + layout + `, "mine": null, "part": ` + layout + `}`)
	require.Equal(t, statusOK, got.status, got.msg)
	var f map[string]any
	require.NoError(t, json.Unmarshal([]byte(got.text), &f))
	assert.Equal(t, false, f["ddp_buckets"].(map[string]any)["aligned"])
	assert.Equal(t, "info", f["log"].(map[string]any)["level"])
	for _, tc := range []struct{ request, want string }{
		{`{"action": "maybe"}`, `action "maybe"`},
		{`{"action": "install"}`, "needs its layout"},
		{`{"action": "keep", "mine": {"buckets": [[0]], "caps": [1], "order": "x", "build": ""}}`, `mine: layout order "x"`},
		{`nope`, "not valid JSON"},
	} {
		got := callFollow(tc.request)
		assert.Equal(t, statusInvalidConfig, got.status, tc.request)
		assert.Contains(t, got.msg, tc.want, tc.request)
		assert.False(t, got.textSet, tc.request)
	}
}

func TestPlanNotesThroughC(t *testing.T) {
	got := callPlanNotes(`{"mode": "ddp", "align_requested": true, "ddp_bucket_order": "declaration", "aligned": true,
		"caps_order": "declaration", "alignment": "declaration-order caps", "merged_cuts": 0, "num_pieces": 3,
		"not_aligned": null, "stand_in": false, "part_of_forward": false, "frame": "f"}`)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.JSONEq(t, `{"settings": null, "notes": [{"text": "goddp: find_unused_parameters=True: DDP never rebuilds its buckets and keeps the ones it fills in declaration order, so goddp gives it caps for that order (declaration-order caps)", "once": true}]}`, got.text)
	got = callPlanNotes(`{"mode": "ddp", "ddp_bucket_order": "ready", "caps_order": "ready"}`)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.JSONEq(t, `{"settings": null, "notes": []}`, got.text)
	for _, tc := range []struct{ request, want string }{
		{`{"mode": "fast", "ddp_bucket_order": "ready", "caps_order": "ready"}`, `mode "fast"`},
		{`{"mode": "ddp", "ddp_bucket_order": "ready", "caps_order": "x"}`, `caps_order "x"`},
		{`[]`, "not valid JSON"},
	} {
		got := callPlanNotes(tc.request)
		assert.Equal(t, statusInvalidConfig, got.status, tc.request)
		assert.Contains(t, got.msg, tc.want, tc.request)
		assert.False(t, got.textSet, tc.request)
	}
}

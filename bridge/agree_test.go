package main

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goddp/goddp/planner"
)

// agreeStatement is one rank's statement proposing a one-bucket layout with
// the given cap, as the shim writes it (its real digest).
func agreeStatement(t *testing.T, capBytes int64) string {
	l := &planner.Layout{Buckets: []planner.LayoutBucket{{Positions: []int32{0}}}, Caps: []int64{capBytes}, Order: planner.OrderReady, Build: "b"}
	d, err := planner.LayoutDigest(l)
	require.NoError(t, err)
	return fmt.Sprintf(`{"layout": {"buckets": [[0]], "caps": [%d], "order": "ready", "build": "b"}, "digest": "%016x"}`, capBytes, d)
}

func TestAgreeThroughC(t *testing.T) {
	s := agreeStatement(t, 4)
	got := callAgree(`{"statements": {"1": ` + s + `, "0": ` + s + `}, "names": {"0": "w"}, "may_defer": true}`)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.Empty(t, got.msg)
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(got.text), &v))
	assert.Equal(t, "install", v["action"])
	assert.Equal(t, 0.0, v["layout_rank"])
	assert.Equal(t, []any{4.0}, v["record"].(map[string]any)["caps"])
}

// TestAgreeRejectsBadRequests: a request no ranks could have sent is
// GODDP_ERR_INVALID_CONFIG with a message, and no verdict is handed out.
func TestAgreeRejectsBadRequests(t *testing.T) {
	s, other := agreeStatement(t, 4), agreeStatement(t, 999)
	var sw, ow map[string]any
	require.NoError(t, json.Unmarshal([]byte(s), &sw))
	require.NoError(t, json.Unmarshal([]byte(other), &ow))
	forged, err := json.Marshal(map[string]any{"layout": ow["layout"], "digest": sw["digest"]})
	require.NoError(t, err)
	for _, tc := range []struct{ request, want string }{
		{`[1]`, "not valid JSON"},
		{`{"statements": {}}`, "at least one statement"},
		{`{"statements": {"0": ` + s + `, "00": ` + s + `}}`, `statements key "00" is not a rank in decimal`},
		{`{"statements": {"+1": ` + s + `}}`, `statements key "+1" is not a rank in decimal`},
		{`{"statements": {" 1": ` + s + `}}`, `statements key " 1" is not a rank in decimal`},
		{`{"statements": {"-1": ` + s + `, "1": ` + s + `}}`, "rank -1 is not a rank"},
		{`{"statements": {"0": ` + s + `}, "names": {"0": "A", "00": "B"}}`, `names key "00" is not a DDP position in decimal`},
		{`{"statements": {"0": ` + s + `}, "names": {"-1": "A"}}`, "DDP position -1"},
		{`{"statements": {"0": {"layout": null, "digest": "00000000000000aa"}, "1": {"layout": null, "digest": "00000000000000aa"}}}`, "without a layout"},
		{`{"statements": {"0": ` + s + `, "1": ` + string(forged) + `}}`, "rank 1 gave layout digest"},
		{`{"statements": {"0": ` + s + `}, "installed": {"0": {}, "7": {"failed": "x"}}}`, "rank 7, which made no statement"},
		{`{"statements": {"0": ` + s + `, "1": ` + s + `}, "installed": {}}`, "no report from rank 0"},
		{`{"statements": {"0": ` + s + `}, "installed": {"00": {}}}`, `installed key "00" is not a rank in decimal`},
	} {
		got := callAgree(tc.request)
		assert.Equal(t, statusInvalidConfig, got.status, tc.request)
		assert.Contains(t, got.msg, tc.want, tc.request)
		assert.False(t, got.textSet, tc.request)
	}
}

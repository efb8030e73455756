package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRoundErrorThroughC: a refused trace round's text, "go"'s null, and
// bad requests refused with a message and no reply.
func TestRoundErrorThroughC(t *testing.T) {
	const group = `"group": {"name": "0", "ranks": [0, 1], "rank": 0, "timeout_s": 5}`
	got := callRoundError(`{"meeting": "enter", ` + group + `, "round": {"outcome": "refused", "complete": true, "statements": {"1": "no", "0": "ok"}}}`)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.JSONEq(t, `{"error": "goddp.trace: cannot enter the trace (rank 1: no)"}`, got.text)
	got = callRoundError(`{"meeting": "first step", "timeout_env": "E", ` + group + `, "round": {"outcome": "go", "statements": {"1": "{}"}}}`)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.JSONEq(t, `{"error": null}`, got.text)
	for _, tc := range []struct{ request, want string }{
		{`[1]`, "not a valid document"},
		{`{"meeting": "nap", ` + group + `, "round": {"outcome": "go"}}`, `meeting "nap"`},
		{`{"meeting": "install", "keeps": true, "timeout_env": "E", ` + group + `, "round": {"outcome": "go"}}`, "only the first-step round keeps"},
	} {
		got := callRoundError(tc.request)
		assert.Equal(t, statusInvalidConfig, got.status, tc.request)
		assert.Contains(t, got.msg, tc.want, tc.request)
		assert.False(t, got.textSet, tc.request)
	}
}

// TestTracePlansThroughC: the records' own values pass through in their
// keys' order; a record the trace cannot read is refused.
func TestTracePlansThroughC(t *testing.T) {
	got := callTracePlans(`{"module": "M#0", "plans": [
		{"fingerprint": 255, "buckets": [{"bytes": 8, "param_names": ["w"]}], "ddp_module": {"type": "M", "key": "M#0"}, "forward": {"z": 1, "a": 2}, "caps": {}},
		{"fingerprint": 1, "buckets": [{"bytes": 8}], "ddp_module": {"key": "M#1"}}]}`)
	require.Equal(t, statusOK, got.status, got.msg)
	assert.Equal(t, `{"plans":[{"fingerprint":"00000000000000ff","mode":null,"num_pieces":null,"bucket_bytes":[8],"bucket_param_names":[["w"]],`+
		`"ddp_buckets":null,"fallback":null,"ddp_module":{"type":"M","key":"M#0"},"forward":{"z":1,"a":2}}]}`, got.text)
	got = callTracePlans(`{"module": "M#0", "plans": [{"buckets": [{}], "ddp_module": {"key": "M#0"}}]}`)
	assert.Equal(t, statusInvalidConfig, got.status)
	assert.Contains(t, got.msg, `bucket 0 has no "bytes"`)
	assert.False(t, got.textSet)
}

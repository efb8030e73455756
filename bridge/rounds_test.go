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

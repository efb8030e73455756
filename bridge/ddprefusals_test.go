package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDDPRefusalThroughC: the goddp_ddp flags and the other facts in, the
// planner's reason (or the unread fact) out.
func TestDDPRefusalThroughC(t *testing.T) {
	for _, tc := range []struct{ request, reply string }{
		{`{"question": "trace", "flags": 0, "comm_hooks": 1}`, `{"refusal": null, "unread": null}`},
		{fmt.Sprintf(`{"question": "trace", "flags": %d, "comm_hooks": null}`, 0x200|0x10),
			`{"refusal": "this DDP module is already being traced (one goddp.trace at a time)", "unread": null}`},
		{fmt.Sprintf(`{"question": "trace", "flags": %d, "comm_hooks": 0}`, 0x2|0x8|0x100),
			`{"refusal": "static_graph=True: a fresh reducer would repeat DDP's static-graph first step", "unread": null}`},
		{`{"question": "trace", "flags": 0, "comm_hooks": null, "logging_error": "E: m"}`, `{"refusal": null, "unread": "comm_hooks"}`},
		{`{"question": "trace", "flags": 0, "comm_hooks": 0, "logging_error": "E: m"}`,
			`{"refusal": "could not read DDP's logging data (E: m)", "unread": null}`},
		{fmt.Sprintf(`{"question": "trace", "flags": %d, "comm_hooks": 0, "builtin_comm_hook": "ALLREDUCE"}`, 0x40),
			`{"refusal": "a built-in C++ comm hook (ALLREDUCE) is registered; it cannot be wrapped (register it as a Python hook, e.g. torch.distributed.algorithms.ddp_comm_hooks, to trace it)", "unread": null}`},
		{`{"question": "rebuild", "flags": 2048}`, `{"refusal": "the first training step runs inside a Join context, whose state lives in DDP's reducer", "unread": null}`},
		{`{"question": "rebuild", "flags": 0}`, `{"refusal": null, "unread": null}`},
	} {
		got := callDDPRefusal(tc.request)
		require.Equal(t, statusOK, got.status, got.msg)
		assert.JSONEq(t, tc.reply, got.text, tc.request)
	}
}

func TestDDPRefusalRejectsBadRequests(t *testing.T) {
	for _, tc := range []struct{ request, want string }{
		{`[1]`, "not valid JSON"},
		{`{"question": "why", "flags": 0}`, `question "why"`},
		{`{"question": "trace", "flags": 4096, "comm_hooks": 0}`, "flags = 0x1000 has unknown bits"},
		{`{"question": "trace", "flags": 64, "comm_hooks": 0}`, "BUILTIN_COMM_HOOK is set exactly when"},
		{`{"question": "trace", "flags": 0, "comm_hooks": 0, "builtin_comm_hook": "X"}`, "BUILTIN_COMM_HOOK is set exactly when"},
		{`{"question": "trace", "flags": 0, "comm_hooks": -1}`, "comm_hooks = -1"},
	} {
		got := callDDPRefusal(tc.request)
		assert.Equal(t, statusInvalidConfig, got.status, tc.request)
		assert.Contains(t, got.msg, tc.want)
		assert.False(t, got.textSet)
	}
}

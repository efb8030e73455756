//go:build goddp_testhooks

package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDebugPanicIsRecovered(t *testing.T) {
	status, msg := callDebugPanic()
	require.Equal(t, statusPanic, status, "want GODDP_ERR_PANIC")
	for _, want := range []string{"Go panic", "deliberate panic", "panicOnPurpose"} {
		assert.Contains(t, msg, want)
	}
	// The process is still fine: the same hook can run again.
	status, _ = callDebugPanic()
	require.Equal(t, statusPanic, status, "second call")
}

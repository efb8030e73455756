package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

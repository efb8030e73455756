package planner

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestPlanTableEscapesNUL: a NUL in a parameter name (or the mode or the
// alignment) is written \x00, so the table survives the C ABI's
// NUL-terminated strings whole, and the same way every time.
func TestPlanTableEscapesNUL(t *testing.T) {
	v := TableView{
		Fingerprint: 1, Mode: "d\x00dp", NumPieces: 1, Caps: TableCaps{BucketCapBytes: mib, FirstBucketCapBytes: mib, AlignBuckets: true},
		Buckets:   []TableBucket{{Index: 0, Bytes: 1, ParamNames: []string{"a\x00b", "c\x00\x00d", "tail"}, Piece: 0}},
		Alignment: "no\x00ne",
	}
	got := v.Table()
	assert.NotContains(t, got, "\x00")
	assert.Equal(t, []string{
		`goddp plan: mode=d\x00dp fingerprint=0000000000000001 pieces=1 buckets=1 cap=1.00 MiB first=1.00 MiB (DDP's buckets set to the pieces: no\x00ne)`,
		"bucket  MiB    piece  params",
		`0       0.000  0      a\x00b`,
		`                      c\x00\x00d`,
		"                      tail",
	}, strings.Split(got, "\n"))
	assert.Equal(t, got, v.Table())
}

package planner

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleLayout() Layout {
	return Layout{
		Buckets: []LayoutBucket{{Positions: []int32{5, 4}}, {Positions: []int32{3, 2}}, {Positions: []int32{1, 0}}},
		Caps:    []int64{4352, 16640, 16900},
		Order:   OrderReady,
		Build:   "goddp 0.1.0 abi 5",
	}
}

// TestLayoutDigestPinned pins the digest: it is compared across processes
// and machines, so an unnoticed change of encoding would make ranks of two
// builds compare unlike digests (bump layoutVersion instead).
func TestLayoutDigestPinned(t *testing.T) {
	l := sampleLayout()
	got, err := LayoutDigest(&l)
	require.NoError(t, err)
	assert.Equal(t, uint64(0x6d741d53f90d3f02), got, "digest %#016x", got)
}

// TestLayoutDigestCoversInputs changes one thing at a time: every change of
// what DDP would communicate changes the digest.
func TestLayoutDigestCoversInputs(t *testing.T) {
	base := sampleLayout()
	want, err := LayoutDigest(&base)
	require.NoError(t, err)
	changes := []struct {
		name   string
		change func(l *Layout)
	}{
		{"position order in a bucket", func(l *Layout) { l.Buckets[0].Positions = []int32{4, 5} }},
		{"a parameter moves bucket", func(l *Layout) {
			l.Buckets[0].Positions = []int32{5, 4, 3}
			l.Buckets[1].Positions = []int32{2}
		}},
		{"a cap", func(l *Layout) { l.Caps[1]++ }},
		{"cap order", func(l *Layout) { l.Caps[0], l.Caps[2] = l.Caps[2], l.Caps[0] }},
		{"bucket order", func(l *Layout) { l.Buckets[0], l.Buckets[2] = l.Buckets[2], l.Buckets[0] }},
		{"fewer buckets", func(l *Layout) {
			l.Buckets = []LayoutBucket{{Positions: []int32{5, 4, 3, 2, 1, 0}}}
			l.Caps = []int64{37892}
		}},
		{"declaration order", func(l *Layout) { l.Order = OrderDeclaration }},
		{"build", func(l *Layout) { l.Build = "goddp 0.1.1 abi 5" }},
		{"build boundary", func(l *Layout) { l.Build = "goddp 0.1.0 abi 5\x00" }},
	}
	for _, tc := range changes {
		l := sampleLayout()
		tc.change(&l)
		got, err := LayoutDigest(&l)
		require.NoError(t, err, tc.name)
		assert.NotEqual(t, want, got, "%s: digest unchanged", tc.name)
	}
}

// TestLayoutDigestDeterministic: equal layouts built apart digest alike, and
// the digest does not depend on the slices' capacity or on earlier calls.
func TestLayoutDigestDeterministic(t *testing.T) {
	a := sampleLayout()
	b := sampleLayout()
	b.Buckets[0].Positions = append(make([]int32, 0, 64), 5, 4)
	da, err := LayoutDigest(&a)
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		db, err := LayoutDigest(&b)
		require.NoError(t, err)
		assert.Equal(t, da, db)
	}
}

func TestLayoutValidate(t *testing.T) {
	bad := []struct {
		name   string
		change func(l *Layout)
		msg    string
	}{
		{"no bucket", func(l *Layout) { l.Buckets = nil }, "at least one bucket"},
		{"empty bucket", func(l *Layout) { l.Buckets[1].Positions = nil }, "bucket 1 holds no parameter"},
		{"no cap", func(l *Layout) { l.Caps = nil }, "at least one cap"},
		{"zero cap", func(l *Layout) { l.Caps[2] = 0 }, "cap 2 is 0 bytes"},
		{"negative position", func(l *Layout) { l.Buckets[0].Positions[1] = -1 }, "DDP position -1"},
		{"repeated position", func(l *Layout) { l.Buckets[2].Positions[0] = 5 }, "DDP position 5 is in layout buckets 0 and 2"},
		{"unknown order", func(l *Layout) { l.Order = 7 }, "bucket order 7"},
	}
	for _, tc := range bad {
		l := sampleLayout()
		tc.change(&l)
		_, err := LayoutDigest(&l)
		var pe *Error
		require.ErrorAs(t, err, &pe, tc.name)
		assert.Equal(t, ErrInvalidConfig, pe.Code, tc.name)
		assert.Contains(t, err.Error(), tc.msg, tc.name)
	}
}

package planner

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAlignmentRefusals: each fact of Note [Alignment refusals] refuses
// alignment with its own reason and the unaligned plan; with several, the
// first in the note's order is the reason; without alignment asked, none
// matters.
func TestAlignmentRefusals(t *testing.T) {
	facts := []struct {
		name   string
		set    func(d *DDPSettings)
		reason AlignReason
	}{
		{"no per-bucket caps", func(d *DDPSettings) { d.NoPerBucketCaps = true }, ReasonNoPerBucketCaps},
		{"Python reducer", func(d *DDPSettings) { d.PythonReducer = true }, ReasonPythonReducer},
		{"mixed precision", func(d *DDPSettings) { d.MixedPrecision = true }, ReasonMixedPrecision},
		{"built-in comm hook", func(d *DDPSettings) { d.BuiltinCommHook = true }, ReasonBuiltinCommHook},
	}
	for i, f := range facts {
		t.Run(f.name, func(t *testing.T) {
			g := mlpModel().graph()
			s := alignedDDP(g, 0, f.set)
			dec, err := Decide(&Request{Graph: g, Settings: s})
			require.NoError(t, err)
			assert.Equal(t, f.reason, dec.AlignReason)
			want, err := Build(g, s.resolve(false))
			require.NoError(t, err)
			assert.Equal(t, want, dec.Plan, "the unaligned plan")
			assert.False(t, dec.Config.AlignBuckets)
			assert.Empty(t, dec.Plan.DDPCaps)

			// Every later fact too: this one is still the reason.
			all := alignedDDP(g, 0, func(d *DDPSettings) {
				for _, later := range facts[i:] {
					later.set(d)
				}
			})
			dec, err = Decide(&Request{Graph: g, Settings: all})
			require.NoError(t, err)
			assert.Equal(t, f.reason, dec.AlignReason, "first in the note's order")

			// Not asked to align: the plain reason.
			s.AlignBuckets = false
			dec, err = Decide(&Request{Graph: g, Settings: s})
			require.NoError(t, err)
			assert.Equal(t, ReasonOff, dec.AlignReason)
		})
	}
	t.Run("none: aligned", func(t *testing.T) {
		g := mlpModel().graph()
		dec, err := Decide(&Request{Graph: g, Settings: alignedDDP(g, 0, nil)})
		require.NoError(t, err)
		assert.Equal(t, ReasonAligned, dec.AlignReason)
	})
}

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
		set    func(d *DDPSettings)
		reason AlignReason
		words  string
	}{
		{func(d *DDPSettings) { d.NoPerBucketCaps = true }, ReasonNoPerBucketCaps, "no per-bucket caps (needs torch >= 2.9)"},
		{func(d *DDPSettings) { d.PythonReducer = true }, ReasonPythonReducer, "DDP uses the Python reducer"},
		{func(d *DDPSettings) { d.StaticGraph = true }, ReasonStaticGraph, "static_graph=True"},
		{func(d *DDPSettings) { d.MixedPrecision = true }, ReasonMixedPrecision, "DDP mixed precision is on"},
		{func(d *DDPSettings) { d.BuiltinCommHook = true }, ReasonBuiltinCommHook, "a built-in comm hook is registered"},
		{func(d *DDPSettings) { d.DelaysAllReduce = true }, ReasonDelayedAllReduce, "delay_all_reduce_named_params is set"},
		{func(d *DDPSettings) { d.SeveralParamGroups = true }, ReasonParamGroups, "several (dtype, device) groups"},
	}
	for i, f := range facts {
		t.Run(f.reason.String(), func(t *testing.T) {
			g := mlpModel().graph()
			s := alignedDDP(g, 0, f.set)
			dec, err := Decide(&Request{Graph: g, Settings: s})
			require.NoError(t, err)
			assert.Equal(t, f.reason, dec.AlignReason)
			assert.Contains(t, dec.AlignDetail, f.words)
			assert.Equal(t, f.reason.String(), dec.AlignDetail)
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
	t.Run("every reason has its own words", func(t *testing.T) {
		seen := map[string]AlignReason{}
		for r := ReasonAligned; r <= ReasonParamGroups; r++ {
			words := r.String()
			require.NotEqual(t, "unknown", words, "reason %d", r)
			_, dup := seen[words]
			require.False(t, dup, "reason %d repeats %q", r, words)
			seen[words] = r
		}
		assert.Equal(t, "unknown", (ReasonParamGroups + 1).String())
	})
}

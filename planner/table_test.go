package planner

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPlanTableByHand pins every part of the table on a view whose text
// was worked out by hand: the caps in MiB, the alignment, the reused and
// eager lines, an extended bucket, a bucket without parameters and column
// widths counted in characters.
func TestPlanTableByHand(t *testing.T) {
	v := TableView{
		Fingerprint: 0xab, Mode: "ddp", NumPieces: 3,
		Caps: TableCaps{BucketCapBytes: 25 * mib, FirstBucketCapBytes: mib / 2, BucketCapsBytes: []int64{mib, 3 * mib / 2},
			MaxPieces: 4, AlignBuckets: true},
		Buckets: []TableBucket{
			{Index: 0, Bytes: 3 * mib / 2, ParamNames: []string{"héad.weight", "head.bias"}, Piece: 2, Extended: true},
			{Index: 1, Bytes: 1024, Piece: 1},
			{Index: 12, Bytes: mib, ParamNames: []string{"embed.weight"}, Piece: 0},
		},
		Alignment: "declaration-order caps, pieces merged", MergedCuts: 2,
		SameAs: []int{0, 1, 1}, Eager: []int{0},
	}
	want := strings.Join([]string{
		"goddp plan: mode=ddp fingerprint=00000000000000ab pieces=3 buckets=3 cap=25.00 MiB first=0.50 MiB " +
			"per-bucket=[1.00, 1.50] MiB max_pieces=4 (DDP's buckets set to the pieces: declaration-order caps, pieces merged, " +
			"2 cuts merged) distinct pieces=2 reused=1",
		"reused compiled pieces (piece=the piece compiled for it): 2=1",
		"eager pieces (edges outside the repeated blocks, not compiled; option edges): 0",
		"bucket  MiB    piece         params",
		"0       1.500  2 (extended)  héad.weight",
		"                             head.bias",
		"1       0.001  1             (none)",
		"12      1.000  0             embed.weight",
	}, "\n")
	assert.Equal(t, want, v.Table())

	// Without comparison, alignment, caps lists or eager pieces, the head
	// line ends after the first cap and only the table follows.
	plain := TableView{Fingerprint: 1, Mode: "torch", NumPieces: 1, Caps: TableCaps{BucketCapBytes: mib, FirstBucketCapBytes: mib},
		Alignment: "none", MergedCuts: 5}
	assert.Equal(t, "goddp plan: mode=torch fingerprint=0000000000000001 pieces=1 buckets=0 cap=1.00 MiB first=1.00 MiB\n"+
		"bucket  MiB  piece  params", plain.Table())
	// Compared pieces, none reused: counts without a reused line.
	plain.SameAs = []int{}
	assert.True(t, strings.HasSuffix(strings.Split(plain.Table(), "\n")[0], " distinct pieces=0 reused=0"))
}

// TestPlanTableGolden renders the tables of Decide's plans (the decision
// golden cases), as the backend would log them before and after the pieces
// are compared.
func TestPlanTableGolden(t *testing.T) {
	type tableCase struct {
		goldenDecision
		sameAs func(v *TableView) []int
	}
	var cases []tableCase
	for _, d := range goldenDecisions() {
		d.name = "table_" + d.name
		var sameAs func(v *TableView) []int
		if d.name == "table_gpt_stacks_aligned" {
			sameAs = blockReuse
		}
		cases = append(cases, tableCase{d, sameAs})
	}
	cases = append(cases, tableCase{goldenDecision{"table_mlp_per_bucket_caps",
		func() (*graphBuilder, *ModuleStacks) { return mlpModel(), nil },
		func(g *Graph) Settings {
			return Settings{Mode: ModeDDP, UserBucketCapBytes: 300, UserFirstBucketCapBytes: 100, UserBucketCapsBytes: []int64{120, 500}, MaxPieces: 3}
		}}, nil})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, st := tc.build()
			g := b.graph()
			dec, err := Decide(&Request{Graph: g, Stacks: st, Settings: tc.settings(g)})
			require.NoError(t, err)
			v := ViewOf(g, dec)
			require.Len(t, v.Buckets, len(dec.Plan.Buckets))
			text := v.Table() + "\n"
			if tc.sameAs != nil {
				v.SameAs = tc.sameAs(&v)
				text += "\n" + v.Table() + "\n"
			}
			checkGolden(t, tc.name, text)
		})
	}
}

// blockReuse makes every piece after the first of the non-eager ones reuse
// it, as identical block pieces do.
func blockReuse(v *TableView) []int {
	same := make([]int, v.NumPieces)
	leader := -1
	for p := range same {
		same[p] = p
		if slices.Contains(v.Eager, p) {
			continue
		}
		if leader < 0 {
			leader = p
		}
		same[p] = leader
	}
	return same
}

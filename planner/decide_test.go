package planner

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// settingsFor gives every cap of cfg as the user's, so that resolving them
// is the identity and Decide plans exactly cfg.
func settingsFor(cfg Config, blockCuts bool) Settings {
	return Settings{
		Mode:                    cfg.Mode,
		UserBucketCapBytes:      cfg.BucketCapBytes,
		UserFirstBucketCapBytes: cfg.FirstBucketCapBytes,
		UserBucketCapsBytes:     cfg.BucketCapsBytes,
		MaxPieces:               cfg.MaxPieces,
		AlignBuckets:            cfg.AlignBuckets,
		BucketOrder:             cfg.BucketOrder,
		BlockCuts:               blockCuts,
	}
}

// defaultDDP is a DDP module built with every default.
func defaultDDP() *DDPSettings {
	return &DDPSettings{BucketCapBytes: 25 * mib, CapIsDefault: true, FirstBucketCapBytes: CapNotGiven}
}

func TestResolveCaps(t *testing.T) {
	ddpWith := func(change func(d *DDPSettings)) *DDPSettings {
		d := defaultDDP()
		change(d)
		return d
	}
	userCap := func(s Settings, c int64) Settings {
		s.UserBucketCapBytes = c
		return s
	}
	cases := []struct {
		name       string
		s          Settings
		cap, first int64
		caps       []int64
	}{
		{"no DDP, nothing given: DDP's defaults", Settings{}, 25 * mib, 1 * mib, nil},
		{"no DDP, a cap: it is also the first cap", userCap(Settings{}, 10*mib), 10 * mib, 10 * mib, nil},
		{"no DDP, torch: 1 MiB first", userCap(Settings{Mode: ModeTorch}, 10*mib), 10 * mib, 1 * mib, nil},
		{"no DDP, torch, small cap: first clamped", userCap(Settings{Mode: ModeTorch}, mib/2), mib / 2, mib / 2, nil},
		{"no DDP, the user's per-bucket caps", Settings{UserBucketCapsBytes: []int64{5, 7}}, 25 * mib, 1 * mib, []int64{5, 7}},
		{"default DDP", Settings{DDP: defaultDDP()}, 25 * mib, 1 * mib, nil},
		{"DDP with a cap of its own: first = cap",
			Settings{DDP: ddpWith(func(d *DDPSettings) { d.BucketCapBytes, d.CapIsDefault = 10*mib, false })}, 10 * mib, 10 * mib, nil},
		{"the same in torch mode: 1 MiB first",
			Settings{Mode: ModeTorch, DDP: ddpWith(func(d *DDPSettings) { d.BucketCapBytes, d.CapIsDefault = 10*mib, false })}, 10 * mib, 1 * mib, nil},
		{"DDP's own first cap is kept",
			Settings{DDP: ddpWith(func(d *DDPSettings) { d.FirstBucketCapBytes = 3 * mib })}, 25 * mib, 3 * mib, nil},
		{"a user cap below DDP's first cap clamps it",
			userCap(Settings{DDP: ddpWith(func(d *DDPSettings) { d.FirstBucketCapBytes = 1 * mib })}, mib/2), mib / 2, mib / 2, nil},
		{"the user's first cap",
			func() Settings {
				s := userCap(Settings{DDP: defaultDDP()}, mib/2)
				s.UserFirstBucketCapBytes = mib / 4
				return s
			}(), mib / 2, mib / 4, nil},
		{"DDP's per-bucket caps",
			Settings{DDP: ddpWith(func(d *DDPSettings) { d.BucketCapsBytes = []int64{1 * mib, 4 * mib} })}, 25 * mib, 1 * mib, []int64{1 * mib, 4 * mib}},
		{"an overridden cap drops DDP's per-bucket caps",
			userCap(Settings{DDP: ddpWith(func(d *DDPSettings) { d.BucketCapsBytes = []int64{1 * mib, 4 * mib} })}, 2*mib), 2 * mib, 1 * mib, nil},
		{"torch mode drops DDP's per-bucket caps",
			Settings{Mode: ModeTorch, DDP: ddpWith(func(d *DDPSettings) { d.BucketCapsBytes = []int64{1 * mib} })}, 25 * mib, 1 * mib, nil},
		{"the user's per-bucket caps win over DDP's",
			Settings{UserBucketCapsBytes: []int64{9}, DDP: ddpWith(func(d *DDPSettings) { d.BucketCapsBytes = []int64{1 * mib} })}, 25 * mib, 1 * mib, []int64{9}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, checkSettings(&tc.s))
			cfg := tc.s.resolve(false)
			assert.Equal(t, tc.cap, cfg.BucketCapBytes, "cap")
			assert.Equal(t, tc.first, cfg.FirstBucketCapBytes, "first cap")
			assert.Equal(t, tc.caps, cfg.BucketCapsBytes, "per-bucket caps")
			assert.LessOrEqual(t, cfg.FirstBucketCapBytes, cfg.BucketCapBytes, "first cap above the cap")
		})
	}
}

func TestBucketOrderFromDDPFlags(t *testing.T) {
	cases := []struct {
		findUnused, static bool
		want               BucketOrder
	}{
		{false, false, OrderReady},
		{true, false, OrderDeclaration},
		{true, true, OrderReady},
		{false, true, OrderReady},
	}
	for _, tc := range cases {
		d := defaultDDP()
		d.FindUnusedParameters, d.StaticGraph = tc.findUnused, tc.static
		s := Settings{DDP: d}
		assert.Equal(t, tc.want, s.resolve(true).BucketOrder, "find_unused=%t static=%t, aligned", tc.findUnused, tc.static)
		// Unaligned, DDP's buckets are its own: the cuts follow ready order.
		assert.Equal(t, OrderReady, s.resolve(false).BucketOrder, "find_unused=%t static=%t, unaligned", tc.findUnused, tc.static)
		// Decide reports DDP's own order, aligned or not, and for a
		// graph without parameters too.
		g := toyModel().graph()
		setDDPPositions(g, countedParams(g))
		for _, align := range []bool{false, true} {
			s.AlignBuckets = align
			dec, err := Decide(&Request{Graph: g, Settings: s})
			require.NoError(t, err)
			assert.Equal(t, tc.want, dec.DDPBucketOrder, "find_unused=%t static=%t align=%t", tc.findUnused, tc.static, align)
		}
		b := &graphBuilder{}
		b.output(b.call("f", in(b.placeholder("x"))))
		dec, err := Decide(&Request{Graph: b.graph(), Settings: s})
		require.NoError(t, err)
		assert.Equal(t, tc.want, dec.DDPBucketOrder, "parameter-free")
	}
	dec, err := Decide(&Request{Graph: toyModel().graph()})
	require.NoError(t, err)
	assert.Equal(t, OrderReady, dec.DDPBucketOrder, "no DDP module")
}

func TestDecideRejects(t *testing.T) {
	ddp := func(change func(d *DDPSettings)) Settings {
		d := defaultDDP()
		change(d)
		return Settings{DDP: d}
	}
	cases := []struct {
		name string
		s    Settings
		code ErrorCode
		want string
	}{
		{"negative user cap", Settings{UserBucketCapBytes: -5}, ErrInvalidConfig, "the user's bucket cap is -5 bytes; it must be > 0"},
		{"negative user first cap", Settings{UserFirstBucketCapBytes: -1}, ErrInvalidConfig, "the user's first-bucket cap is -1 bytes; it must be > 0"},
		{"user first cap above the cap", Settings{UserBucketCapBytes: 10, UserFirstBucketCapBytes: 20},
			ErrInvalidConfig, "FirstBucketCapBytes (20) must not exceed BucketCapBytes (10)"},
		{"zero per-bucket cap", Settings{UserBucketCapsBytes: []int64{3, 0}}, ErrInvalidConfig, "BucketCapsBytes[1] must be > 0"},
		{"zero DDP cap", ddp(func(d *DDPSettings) { d.BucketCapBytes = 0 }), ErrInvalidConfig, "DDP's bucket cap is 0 bytes"},
		{"DDP first cap -1", ddp(func(d *DDPSettings) { d.FirstBucketCapBytes = -1 }), ErrInvalidConfig, "DDP's first-bucket cap is -1 bytes; it must be > 0, or 0 when the module keeps none"},
		{"zero DDP per-bucket cap", ddp(func(d *DDPSettings) { d.BucketCapsBytes = []int64{0} }), ErrInvalidConfig, "DDP's per-bucket cap 0 is 0 bytes"},
		{"negative DDP parameter count", ddp(func(d *DDPSettings) { d.NumParams = -1 }), ErrInvalidConfig, "DDP's parameter count is -1"},
		{"explicit order with DDP", func() Settings { s := ddp(func(*DDPSettings) {}); s.BucketOrder = OrderDeclaration; return s }(),
			ErrInvalidConfig, "explicit bucket order (1) together with DDP settings"},
		{"unknown edge policy", Settings{Edges: 7}, ErrInvalidConfig, "unknown edge policy 7"},
		{"block cuts in torch mode", Settings{Mode: ModeTorch, BlockCuts: true}, ErrInvalidConfig, "BlockCuts is not supported in ModeTorch"},
		{"unknown mode", Settings{Mode: 9}, ErrInvalidConfig, "unknown mode 9"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decide(&Request{Graph: toyModel().graph(), Settings: tc.s})
			var perr *Error
			require.ErrorAs(t, err, &perr)
			assert.Equal(t, tc.code, perr.Code)
			assert.Contains(t, perr.Msg, tc.want)
		})
	}

	t.Run("no graph", func(t *testing.T) {
		_, err := Decide(&Request{})
		require.ErrorContains(t, err, "request has no graph")
		_, err = Decide(nil)
		require.ErrorContains(t, err, "request has no graph")
	})
	t.Run("block ids and stacks", func(t *testing.T) {
		b, blocks := gptModel(2, 8)
		g := b.graph()
		g.BlockIDs = blocks
		_, err := Decide(&Request{Graph: g, Stacks: gptStacks(blocks), Settings: Settings{BlockCuts: true}})
		require.ErrorContains(t, err, "both BlockIDs and module stacks given")
	})
	t.Run("DDP position out of range", func(t *testing.T) {
		g := toyModel().graph()
		setDDPPositions(g, countedParams(g))
		g.Params[0].DDPPosition = 99
		d := defaultDDP()
		d.NumParams = len(countedParams(g))
		_, err := Decide(&Request{Graph: g, Settings: Settings{AlignBuckets: true, DDP: d}})
		require.ErrorContains(t, err, `parameter 0 ("fc1.weight"): DDP position 99 out of range [-1, 8)`)
	})
}

// TestDecideMatchesBuild: with every cap given, Decide plans exactly what
// Build plans (same fingerprints, so the golden files hold for it too).
func TestDecideMatchesBuild(t *testing.T) {
	for _, tc := range planCases {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.model().graph()
			want, err := Build(g, tc.cfg)
			require.NoError(t, err)
			dec, err := Decide(&Request{Graph: g, Settings: settingsFor(tc.cfg, false)})
			require.NoError(t, err)
			assert.Equal(t, want, dec.Plan)
			assert.Equal(t, tc.cfg, dec.Config)
			wantReason := ReasonOff
			if tc.cfg.AlignBuckets {
				wantReason = ReasonAligned // no DDP module: nothing to check coverage against
			}
			assert.Equal(t, wantReason, dec.AlignReason)
		})
	}
}

// alignedDDP asks for aligned buckets from a DDP module that reduces the
// graph's counted parameters (plus extra more), declared in table order.
func alignedDDP(g *Graph, extra int, change func(d *DDPSettings)) Settings {
	counted := countedParams(g)
	setDDPPositions(g, counted)
	d := defaultDDP()
	d.NumParams = len(counted) + extra
	if change != nil {
		change(d)
	}
	s := Settings{AlignBuckets: true, DDP: d}
	s.UserBucketCapBytes = 45000
	s.UserFirstBucketCapBytes = 20
	return s
}

func TestDecideAlignment(t *testing.T) {
	t.Run("covered", func(t *testing.T) {
		g := mlpModel().graph()
		dec, err := Decide(&Request{Graph: g, Settings: alignedDDP(g, 0, nil)})
		require.NoError(t, err)
		assert.Equal(t, ReasonAligned, dec.AlignReason)
		assert.Zero(t, dec.AlignedParams)
		assert.True(t, dec.Config.AlignBuckets)
		assert.Equal(t, AlignReady, dec.Plan.Alignment)
		require.Greater(t, dec.Plan.NumPieces, 1)
		for k, b := range dec.Plan.Buckets {
			assert.Equal(t, b.Bytes, dec.Plan.DDPCaps[k])
		}
	})
	t.Run("part of a forward: the aligned plan is kept, not handed to DDP", func(t *testing.T) {
		g := mlpModel().graph()
		settings := alignedDDP(g, 1, nil) // DDP has a parameter the graph lacks
		dec, err := Decide(&Request{Graph: g, Settings: settings})
		require.NoError(t, err)
		assert.Equal(t, ReasonPartOfForward, dec.AlignReason)
		assert.Equal(t, 8, dec.AlignedParams, "of DDP's %d", settings.DDP.NumParams)
		want, err := Build(g, settings.resolve(true))
		require.NoError(t, err)
		assert.Equal(t, want.Buckets, dec.Plan.Buckets)
		assert.Equal(t, AlignReady, dec.Plan.Alignment)
		assert.False(t, dec.Config.AlignBuckets)
	})
	t.Run("not covered: planned again unaligned", func(t *testing.T) {
		for name, s := range map[string]func(g *Graph) Settings{
			"DDP has a parameter the graph lacks, in declaration order": func(g *Graph) Settings {
				s := alignedDDP(g, 1, nil)
				s.DDP.FindUnusedParameters = true
				return s
			},
			"a parameter that is not DDP's": func(g *Graph) Settings {
				s := alignedDDP(g, 0, nil)
				g.Params[0].DDPPosition = -1
				return s
			},
		} {
			g := mlpModel().graph()
			settings := s(g)
			dec, err := Decide(&Request{Graph: g, Settings: settings})
			require.NoError(t, err, name)
			assert.Equal(t, ReasonNotCovered, dec.AlignReason, name)
			assert.Equal(t, 8, dec.AlignedParams, name)
			unaligned := settings.resolve(false)
			want, err := Build(g, unaligned)
			require.NoError(t, err)
			assert.Equal(t, want, dec.Plan, name)
			assert.Equal(t, unaligned, dec.Config, name)
		}
	})
	t.Run("one piece: nothing to align", func(t *testing.T) {
		g := sharedWeightModel().graph()
		s := alignedDDP(g, 0, nil)
		s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 3000, 3000
		dec, err := Decide(&Request{Graph: g, Settings: s})
		require.NoError(t, err)
		assert.Equal(t, ReasonOnePiece, dec.AlignReason)
		assert.Zero(t, dec.AlignedParams)
		assert.Equal(t, 1, dec.Plan.NumPieces)
		assert.Equal(t, AlignNone, dec.Plan.Alignment)
		assert.Empty(t, dec.Plan.DDPCaps)
		assert.False(t, dec.Config.AlignBuckets)
		// The plan is still the aligned one: its fingerprint is unchanged.
		aligned, err := Build(g, s.resolve(true))
		require.NoError(t, err)
		assert.Equal(t, aligned.Fingerprint, dec.Plan.Fingerprint)
	})
	t.Run("declaration order from DDP's flags", func(t *testing.T) {
		g := mlpModel().graph()
		dec, err := Decide(&Request{Graph: g, Settings: alignedDDP(g, 0, func(d *DDPSettings) { d.FindUnusedParameters = true })})
		require.NoError(t, err)
		assert.Equal(t, OrderDeclaration, dec.Config.BucketOrder)
		assert.Contains(t, []Alignment{AlignDeclaration, AlignDeclarationMerged}, dec.Plan.Alignment)
		assert.Equal(t, "declaration-order caps", dec.Plan.Alignment.String())
	})
	t.Run("caps of at least one byte", func(t *testing.T) {
		b := &graphBuilder{}
		p0, p1 := b.param("zero", 0), b.param("w", 100)
		x := b.placeholder("x")
		h0, h1 := b.placeholder("l_zero"), b.placeholder("l_w")
		n0 := b.call("n0", in(x, h0), arg(p0))
		n1 := b.call("n1", in(n0, h1), arg(p1))
		b.output(n1)
		g := b.graph()
		s := alignedDDP(g, 0, nil)
		s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 100, 100
		dec, err := Decide(&Request{Graph: g, Settings: s})
		require.NoError(t, err)
		require.Equal(t, ReasonAligned, dec.AlignReason)
		require.Equal(t, 2, dec.Plan.NumPieces)
		assert.Equal(t, []int64{100, 0}, []int64{dec.Plan.Buckets[0].Bytes, dec.Plan.Buckets[1].Bytes})
		assert.Equal(t, []int64{100, 1}, dec.Plan.DDPCaps)
	})
}

func TestCountedParams(t *testing.T) {
	for _, tc := range []struct {
		model func() *graphBuilder
		want  int
	}{{toyModel, 8}, {ignoredParamModel, 4}, {noComputeModel, 1}} {
		g := tc.model().graph()
		dec, err := Decide(&Request{Graph: g, Settings: Settings{}})
		require.NoError(t, err)
		assert.Equal(t, tc.want, dec.CountedParams)
		assert.Equal(t, len(countedParams(g)), dec.CountedParams)
	}
}

// referencePieceParams is PieceParams written from the definition: ModeDDP,
// each bucketed parameter at the first compute node that refers to it,
// ordered by node and by its first listing there; ModeTorch, the buckets'
// parameters per piece, in forward order.
func referencePieceParams(g *Graph, pl *Plan, mode Mode) [][]int32 {
	per := make([][]int32, pl.NumPieces)
	if mode == ModeTorch {
		for k := len(pl.Buckets) - 1; k >= 0; k-- {
			b := pl.Buckets[k]
			rev := slices.Clone(b.Params)
			slices.Reverse(rev)
			per[b.Piece] = append(per[b.Piece], rev...)
		}
		return per
	}
	type use struct{ node, slot int }
	first := map[int32]use{}
	for _, b := range pl.Buckets {
		for _, p := range b.Params {
			for i := range g.Ops {
				if !isCompute(g.Ops[i]) {
					continue
				}
				refs := g.ParamIndex[g.ParamOffsets[i]:g.ParamOffsets[i+1]]
				if s := slices.Index(refs, p); s >= 0 {
					first[p] = use{i, s}
					break
				}
			}
		}
	}
	params := make([]int32, 0, len(first))
	for p := range first {
		params = append(params, p)
	}
	slices.SortFunc(params, func(a, b int32) int {
		if first[a].node != first[b].node {
			return first[a].node - first[b].node
		}
		return first[a].slot - first[b].slot
	})
	for _, p := range params {
		piece := pl.NodePiece[first[p].node]
		per[piece] = append(per[piece], p)
	}
	return per
}

func TestPieceParamsAgainstReference(t *testing.T) {
	forRandomFuzzInputs(t, rand.New(rand.NewPCG(4242, 3)), 3000, 400, func(data []byte) {
		g, cfg := decodeFuzzInput(data)
		want, err := Build(g, cfg)
		if err != nil {
			return
		}
		dec, err := Decide(&Request{Graph: g, Settings: settingsFor(cfg, false)})
		require.NoError(t, err)
		ref := referencePieceParams(g, want, cfg.Mode)
		for p := range ref {
			if len(ref[p]) == 0 {
				ref[p] = nil
			}
		}
		got := slices.Clone(dec.PieceParams)
		for p := range got {
			if len(got[p]) == 0 {
				got[p] = nil
			}
		}
		require.Equal(t, ref, got)
	})
}

// edgeGraph lays out pieces of one compute node per entry (the entry is
// its block, -1 for none) between a placeholder and the output, and
// returns the graph with its block ids and the node pieces.
func edgeGraph(layout [][]int32) (*Graph, []int32, int) {
	b := &graphBuilder{}
	prev := b.placeholder("x")
	blocks, pieces := []int32{-1}, []int32{-1}
	for piece, members := range layout {
		for k, block := range members {
			prev = b.call(fmt.Sprintf("n%d_%d", piece, k), in(prev))
			blocks, pieces = append(blocks, block), append(pieces, int32(piece))
		}
	}
	b.output(prev)
	g := b.graph()
	g.BlockIDs = append(blocks, -1)
	return g, append(pieces, -1), len(layout)
}

func TestEagerPieces(t *testing.T) {
	cases := []struct {
		name   string
		layout [][]int32
		policy EdgePolicy
		want   []int32
	}{
		// preamble of 2 nodes, blocks of 3 (the second with a trailing node
		// outside any block, joined to it), a tail of 4 (auto: edges_test.go)
		{"auto without costs compiles every edge", [][]int32{{-1, -1}, {0, 0, 0}, {1, 1, 1, -1}, {-1, -1, -1, -1}}, EdgesAuto, nil},
		{"eager keeps every edge", [][]int32{{-1, -1}, {0, 0, 0}, {1, 1, 1, -1}, {-1, -1, -1, -1}}, EdgesEager, []int32{0, 3}},
		{"compile keeps none", [][]int32{{-1, -1}, {0, 0, 0}, {1, 1, 1, -1}, {-1, -1, -1, -1}}, EdgesCompile, nil},
		{"a piece between blocks is no edge", [][]int32{{-1}, {0, 0, 0}, {-1}, {1, 1, 1}, {-1}}, EdgesEager, []int32{0, 4}},
		{"a piece reaching into a block is no edge", [][]int32{{-1, 0, 0}, {0, 1, 1, 1}}, EdgesEager, nil},
		{"no blocks, no edges", [][]int32{{-1}, {-1, -1}}, EdgesEager, nil},
	}
	for _, tc := range cases {
		g, pieces, n := edgeGraph(tc.layout)
		assert.Equal(t, tc.want, eagerPieces(g, pieces, n, tc.policy), tc.name)
	}
	g, pieces, n := edgeGraph([][]int32{{-1}, {0, 0}, {1, 1}, {-1}})
	g.BlockIDs = nil
	assert.Nil(t, eagerPieces(g, pieces, n, EdgesEager), "no block ids")
}

// gptStacks is the module stacks that give gptModel's blocks: each block
// node inside "L['self'].blocks.<l>" (under the model itself), the others
// inside the model only.
func gptStacks(blocks []int32) *ModuleStacks {
	stacks := make([][]stackEntry, len(blocks))
	for i, l := range blocks {
		stacks[i] = []stackEntry{{"L['self']", "GPT"}}
		if l >= 0 {
			stacks[i] = append(stacks[i], stackEntry{fmt.Sprintf("L['self'].blocks.%d", l), "Block"})
		}
	}
	return stacksOf(stacks, false)
}

// renderDecision extends render with what Decide adds to the plan.
func renderDecision(g *Graph, names []string, dec *Decision) string {
	var s strings.Builder
	s.WriteString(render(g, names, dec.Config, dec.Plan))
	paramNames := func(ps []int32) string {
		out := make([]string, len(ps))
		for k, p := range ps {
			out[k] = g.Params[p].Name
		}
		return "[" + strings.Join(out, " ") + "]"
	}
	fmt.Fprintf(&s, "decision: order=%d align=%d (aligned params %d) alignment=%q ddp_caps=%v merged_cuts=%d counted=%d\n",
		dec.Config.BucketOrder, dec.AlignReason, dec.AlignedParams, dec.Plan.Alignment.String(), dec.Plan.DDPCaps,
		dec.Plan.MergedCuts, dec.CountedParams)
	for p, ps := range dec.PieceParams {
		fmt.Fprintf(&s, "piece %d params: %s\n", p, paramNames(ps))
	}
	fmt.Fprintf(&s, "eager pieces: %v\nblock ids: %v\n", dec.EagerPieces, dec.BlockIDs)
	return s.String()
}

// goldenDecision is one case of the decision goldens: a model and the
// settings it is decided under. The plan-table goldens of the shim
// (tests/python/backend/test_plan_table.py) show the same decisions.
type goldenDecision struct {
	name     string
	build    func() (*graphBuilder, *ModuleStacks)
	settings func(g *Graph) Settings
}

func goldenDecisions() []goldenDecision {
	return []goldenDecision{
		{"gpt_stacks_aligned", func() (*graphBuilder, *ModuleStacks) {
			b, blocks := gptModel(4, 8)
			return b, gptStacks(blocks)
		}, func(g *Graph) Settings {
			s := alignedDDP(g, 0, nil)
			s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 7000, 100
			s.BlockCuts, s.Edges = true, EdgesAuto
			return s
		}},
		{"gpt_stacks_costly_tail", func() (*graphBuilder, *ModuleStacks) {
			b, blocks := gptModel(4, 8)
			return b, gptStacks(blocks)
		}, func(g *Graph) Settings {
			// The loss over a large vocabulary inside ln_f's node: the tail's
			// unfused bytes are a measurable share of the step.
			g.NodeBytes[slices.Index(g.Ops, OpOutput)-2] += 2 * 1024 * 50304 * f32
			s := alignedDDP(g, 0, nil)
			s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 7000, 100
			s.BlockCuts, s.Edges = true, EdgesAuto
			return s
		}},
		{"gpt_stacks_find_unused", func() (*graphBuilder, *ModuleStacks) {
			b, blocks := gptModel(3, 8)
			return b, gptStacks(blocks)
		}, func(g *Graph) Settings {
			s := alignedDDP(g, 0, func(d *DDPSettings) { d.FindUnusedParameters = true })
			s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 7000, 100
			s.BlockCuts, s.Edges = true, EdgesEager
			return s
		}},
		{"mlp_not_covered", func() (*graphBuilder, *ModuleStacks) { return mlpModel(), nil },
			func(g *Graph) Settings { return alignedDDP(g, 2, nil) }},
		{"toy_torch_defaults", func() (*graphBuilder, *ModuleStacks) { return toyModel(), nil },
			func(g *Graph) Settings { return Settings{Mode: ModeTorch, DDP: defaultDDP()} }},
	}
}

// gptCosts gives g the node costs (Note [Edge costs]) that gptModel's
// nodes have at width d over tokens tokens (shapes as in bench's GPT, a
// 16-token vocabulary), by name: the matrix products and attention as
// kernel flops, every other node as the bytes it reads and writes. Other
// models' nodes cost nothing.
func gptCosts(g *Graph, names []string, tokens, d int64) *Graph {
	g.NodeFlops, g.NodeBytes = make([]int64, len(g.Ops)), make([]int64, len(g.Ops))
	act := tokens * d * f32
	for i, name := range names {
		base, _, _ := strings.Cut(name, "_")
		switch base {
		case "qkv":
			g.NodeFlops[i] = 2 * tokens * d * 3 * d
		case "proj":
			g.NodeFlops[i] = 2 * tokens * d * d
		case "fc", "out":
			g.NodeFlops[i] = 2 * tokens * d * 4 * d
		case "sdpa":
			g.NodeFlops[i] = 4 * tokens * 4 * d
		case "head":
			g.NodeFlops[i] = 2 * tokens * d * 16
		case "ln1", "ln2", "ln", "embedding", "add", "split":
			g.NodeBytes[i] = 2 * act
		case "gelu":
			g.NodeBytes[i] = 8 * act
		}
	}
	return g
}

func TestDecideGolden(t *testing.T) {
	for _, tc := range goldenDecisions() {
		tc.name = "decide_" + tc.name
		t.Run(tc.name, func(t *testing.T) {
			b, st := tc.build()
			g := gptCosts(b.graph(), b.names, 1024, 256)
			dec, err := Decide(&Request{Graph: g, Stacks: st, Settings: tc.settings(g)})
			require.NoError(t, err)
			planned := *g
			planned.BlockIDs = dec.BlockIDs
			// Block cuts do not apply under declaration order (see Build).
			blocksIdle := planned.BlockIDs != nil && dec.Config.BucketOrder == OrderDeclaration
			cfg := dec.Config
			if dec.AlignReason == ReasonPartOfForward {
				cfg.AlignBuckets = true // the aligned plan, kept for CombineForward
			}
			if dec.AlignReason != ReasonOnePiece && !blocksIdle {
				for _, v := range checkPlan(&planned, cfg, dec.Plan) {
					t.Error(v)
				}
			}
			checkGolden(t, tc.name, renderDecision(g, b.names, dec))
		})
	}
}

// TestStackBlocksMatchGivenBlocks: the module stacks of gptModel give its
// hand-made block ids, so Decide's block plan is Build's.
func TestStackBlocksMatchGivenBlocks(t *testing.T) {
	b, blocks := gptModel(4, 8)
	cfg := alignedCfg(ddpCfg(7000, 100))
	given := b.graph()
	given.BlockIDs = blocks
	want, err := Build(given, cfg)
	require.NoError(t, err)
	dec, err := Decide(&Request{Graph: b.graph(), Stacks: gptStacks(blocks), Settings: settingsFor(cfg, true)})
	require.NoError(t, err)
	assert.Equal(t, blocks, dec.BlockIDs)
	assert.Equal(t, want, dec.Plan)

	// Without BlockCuts the stacks are ignored.
	plain, err := Build(b.graph(), cfg)
	require.NoError(t, err)
	dec, err = Decide(&Request{Graph: b.graph(), Stacks: gptStacks(blocks), Settings: settingsFor(cfg, false)})
	require.NoError(t, err)
	assert.Nil(t, dec.BlockIDs)
	assert.Equal(t, plain, dec.Plan)
}

// TestDecideParameterFree: a graph without DDP parameters gets one piece and
// no bucket, whatever a plan would have refused (Note [Parameter-free
// graphs]); the same settings with a parameter still fail.
func TestDecideParameterFree(t *testing.T) {
	graphWith := func(opts ...paramOpt) *Graph {
		b := &graphBuilder{}
		x := b.placeholder("x")
		var refs []paramRef
		if opts != nil {
			refs = append(refs, module(b.param("w", 64, opts...)))
		}
		y := b.call("mul", in(x), refs...)
		z := b.call("add", in(y))
		b.output(z)
		return b.graph()
	}
	firstAboveCap := Settings{UserFirstBucketCapBytes: 30 * mib, AlignBuckets: true, DDP: defaultDDP()}
	zeroDDPCap := Settings{DDP: &DDPSettings{FirstBucketCapBytes: CapNotGiven}}
	cases := []struct {
		name string
		g    *Graph
		s    Settings
	}{
		{"no parameters, first cap above the cap", graphWith(), firstAboveCap},
		{"no parameters, DDP cap 0", graphWith(), zeroDDPCap},
		{"a frozen parameter only", graphWith(frozen), firstAboveCap},
		{"an ignored parameter only", graphWith(ignored), firstAboveCap},
		{"no parameters, block cuts in torch mode", graphWith(), Settings{Mode: ModeTorch, BlockCuts: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dec, err := Decide(&Request{Graph: tc.g, Settings: tc.s})
			require.NoError(t, err)
			assert.Equal(t, 0, dec.CountedParams)
			assert.Equal(t, ReasonNoParams, dec.AlignReason)
			pl := dec.Plan
			assert.Equal(t, 1, pl.NumPieces)
			assert.Empty(t, pl.Buckets)
			assert.Empty(t, pl.DDPCaps)
			assert.Equal(t, []int32{-1, 0, 0, -1}, pl.NodePiece)
			assert.Equal(t, [][]int32{{0}}, pl.PieceInputs)
			assert.Equal(t, [][]int32{{2}}, pl.PieceOutputs)
			assert.False(t, dec.Config.AlignBuckets)
			assert.Equal(t, [][]int32{nil}, dec.PieceParams)
			again, err := Decide(&Request{Graph: tc.g, Settings: tc.s})
			require.NoError(t, err)
			assert.Equal(t, pl.Fingerprint, again.Plan.Fingerprint, "deterministic")
		})
	}
	t.Run("the same settings with a parameter fail", func(t *testing.T) {
		_, err := Decide(&Request{Graph: graphWith(dtype(0)), Settings: firstAboveCap})
		require.ErrorContains(t, err, "FirstBucketCapBytes (31457280) must not exceed BucketCapBytes (26214400)")
		_, err = Decide(&Request{Graph: graphWith(dtype(0)), Settings: zeroDDPCap})
		require.ErrorContains(t, err, "DDP's bucket cap is 0 bytes")
	})
	t.Run("a bad graph is still an error", func(t *testing.T) {
		g := graphWith()
		g.Ops = g.Ops[:len(g.Ops)-1]
		_, err := Decide(&Request{Graph: g, Settings: firstAboveCap})
		require.Error(t, err)
	})
}

// TestParameterFreeMatchesBuild: where Build plans a graph without DDP
// parameters, it makes the same pieces as Decide's shortcut.
func TestParameterFreeMatchesBuild(t *testing.T) {
	seen := 0
	forRandomFuzzInputs(t, rand.New(rand.NewPCG(77, 5)), 3000, 400, func(data []byte) {
		g, cfg := decodeFuzzInput(data)
		if slices.ContainsFunc(g.Params, func(p Param) bool { return p.counted() }) {
			return
		}
		want, err := Build(g, cfg)
		if err != nil {
			return
		}
		seen++
		dec, err := Decide(&Request{Graph: g, Settings: settingsFor(cfg, false)})
		require.NoError(t, err)
		require.Equal(t, want.NumPieces, dec.Plan.NumPieces)
		require.Equal(t, want.NodePiece, dec.Plan.NodePiece)
		require.Equal(t, want.PieceInputs, dec.Plan.PieceInputs)
		require.Equal(t, want.PieceOutputs, dec.Plan.PieceOutputs)
		for _, b := range want.Buckets {
			require.Empty(t, b.Params) // torch mode keeps an empty bucket
		}
	})
	require.Positive(t, seen)
}

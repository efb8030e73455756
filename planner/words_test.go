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

// member is a forward member with a layout of the given buckets.
func member(describe string, order BucketOrder, buckets ...[]int32) ForwardMember {
	l := agreeLayout(make([]int64, len(buckets)), buckets...)
	l.Order = order
	return ForwardMember{Layout: l, Describe: describe}
}

func noLayout(describe string, reason *string) ForwardMember {
	return ForwardMember{Reason: reason, Describe: describe}
}

func planForward(t testing.TB, bytes []int64, members ...ForwardMember) *ForwardOutcome {
	out, err := PlanForward(&ForwardRequest{Members: members, ParamBytes: bytes, Build: agreeBuild})
	require.NoError(t, err)
	return out
}

// TestPlanForwardRefusals: each refusal of a forward, in the order it is
// checked.
func TestPlanForwardRefusals(t *testing.T) {
	bytes := []int64{4, 4, 8}
	for _, tc := range []struct {
		name    string
		members []ForwardMember
		want    string
	}{
		{"no layout", []ForwardMember{member("g0", OrderReady, []int32{0}), noLayout("g1", ptr("fallback: x")), noLayout("g2", nil)},
			"a graph of the forward has no layout to combine (g1: fallback: x)"},
		{"no layout, no reason", []ForwardMember{noLayout("g0", nil)}, "a graph of the forward has no layout to combine (g0: None)"},
		{"no layout before the order", []ForwardMember{member("g0", OrderDeclaration, []int32{0}), noLayout("g1", ptr("r"))},
			"a graph of the forward has no layout to combine (g1: r)"},
		{"declaration", []ForwardMember{member("g0", OrderReady, []int32{0, 1}), member("g1", OrderDeclaration, []int32{2})},
			"the forward's graphs are bucketed in declaration order, which DDP never rebuilds"},
		{"no member", nil, "the forward's graphs are bucketed in declaration order, which DDP never rebuilds"},
		{"combine's error", []ForwardMember{member("g0", OrderReady, []int32{0})},
			"planner: the forward's 1 graphs use 1 of DDP's 3 parameters (DDP position 1 is in none of them): DDP buckets the others too, so no caps can close its buckets at the cuts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := planForward(t, bytes, tc.members...)
			require.NotNil(t, out.Refusal)
			assert.Equal(t, tc.want, *out.Refusal)
			assert.Nil(t, out.Layout)
			assert.Nil(t, out.Digest)
			assert.Nil(t, out.Combined)
			assert.Equal(t, "no layout: "+tc.want, out.Note.Text[strings.LastIndex(out.Note.Text, "; no layout: ")+2:])
		})
	}
}

// TestPlanForwardCombines: the layout is CombineForward's, in "ready"
// order, with the request's build and its digest.
func TestPlanForwardCombines(t *testing.T) {
	out := planForward(t, []int64{4, 4, 8}, member("g0", OrderReady, []int32{1}, []int32{0}), member("g1", OrderReady, []int32{2, 0}))
	require.Nil(t, out.Refusal)
	want := &Layout{Buckets: []LayoutBucket{{Positions: []int32{2}}, {Positions: []int32{1}}, {Positions: []int32{0}}},
		Caps: []int64{8, 4, 4}, Order: OrderReady, Build: agreeBuild}
	assert.Equal(t, want, out.Layout)
	d, err := LayoutDigest(want)
	require.NoError(t, err)
	assert.Equal(t, d, *out.Digest)
	assert.Equal(t, 1, out.Combined.Moved)
	assert.Equal(t, []string{"g0", "g1"}, out.Graphs)
	assert.False(t, out.Note.Warning)
	assert.Equal(t, "goddp: planning the 2 graph(s) of this DDP module's first training forward together: g0; g1; DDP buckets [8, 4, 4] bytes", out.Note.Text)
}

// TestPlanForwardUndigestible: a combined layout the digest refuses (DDP
// reduces no parameter) is refused, and CombineForward's plan stays.
func TestPlanForwardUndigestible(t *testing.T) {
	out := planForward(t, nil, member("g0", OrderReady))
	require.NotNil(t, out.Refusal)
	assert.Equal(t, "could not state DDP's layout (PlannerError: planner: a layout needs at least one bucket)", *out.Refusal)
	assert.Nil(t, out.Layout)
	assert.NotNil(t, out.Combined)
}

func TestPlanForwardRejectsUnknownOrder(t *testing.T) {
	_, err := PlanForward(&ForwardRequest{Members: []ForwardMember{member("g0", BucketOrder(7), []int32{0})}, ParamBytes: []int64{1}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "graph 0 of the forward has layout bucket order 7")
}

func TestFirstLine(t *testing.T) {
	for text, want := range map[string]string{"a": "a", "  a\nb": "a", "a\r\nb": "a", "": "E", " \n ": "E"} {
		assert.Equal(t, want, firstLine(text, "E"), "%q", text)
	}
}

// TestOutcomeLine: the line for each kind of verdict; none without a group
// or for an error.
func TestOutcomeLine(t *testing.T) {
	g := &AgreeGroup{Name: "default_pg", Size: 2}
	at := func(mayDefer bool, st ...Statement) *Verdict {
		v, err := Agree(&AgreeRequest{Statements: st, Names: agreeNames(), MayDefer: mayDefer, Group: g})
		require.NoError(t, err)
		return v
	}
	assert.Equal(t, &LogLine{Text: "goddp: DDP's 3 buckets now close at piece boundaries on all 2 rank(s) of process group 'default_pg' (per-bucket caps [4096, 8192, 1024] bytes)"},
		at(true, proposes(t, 0, agreeA), proposes(t, 1, agreeA)).Log)
	assert.Equal(t, &LogLine{Text: "goddp: the 2 rank(s) of process group 'default_pg' decide DDP's buckets at the module's next training call"},
		at(true, proposes(t, 0, agreeA), later(proposes(t, 1, agreeA))).Log)
	assert.Equal(t, &LogLine{Text: "goddp: DDP keeps its own buckets on all 2 rank(s) of process group 'default_pg': align_buckets=False"},
		at(true, keeps(0, "align_buckets=False"), keeps(1, "align_buckets=False")).Log)
	warn := at(true, proposes(t, 0, agreeA), keeps(1, "x")).Log
	assert.True(t, warn.Warning)
	assert.True(t, strings.HasSuffix(warn.Text, ". Gradients stay exact; only the overlap of allreduces with backward is smaller."), warn.Text)
	assert.Contains(t, at(true, Statement{Rank: 0}, Statement{Rank: 1}).Log.Text, "'default_pg': None")

	v, err := Agree(&AgreeRequest{Statements: []Statement{proposes(t, 0, agreeA)}, MayDefer: true})
	require.NoError(t, err)
	assert.Nil(t, v.Log)
	v, err = Agree(&AgreeRequest{Statements: []Statement{lost(proposes(t, 0, agreeA), "x")}, Group: g})
	require.NoError(t, err)
	assert.Nil(t, v.Log)
	_, err = Agree(&AgreeRequest{Statements: []Statement{proposes(t, 0, agreeA)}, Group: &AgreeGroup{Name: "g", Size: 0}})
	require.ErrorContains(t, err, "process group 'g' has 0 ranks")
}

// TestWords pins the lines users read (testdata/words.golden; go test
// ./planner -run Words -update rewrites it).
func TestWords(t *testing.T) {
	checkGolden(t, "words", renderWords(t))
}

func renderWords(t testing.TB) string {
	var b strings.Builder
	groups := []*AgreeGroup{{Name: "0", Size: 2}, {Name: "it's", Size: 1}}
	failed := keeps(3, "fallback: planning failed")
	failed.Fingerprint = nil
	rounds := []struct {
		name     string
		mayDefer bool
		st       []Statement
		install  map[int]InstallReport
		unsettle *Unsettled
	}{
		{"install", true, []Statement{proposes(t, 1, agreeA), proposes(t, 0, agreeA)}, nil, nil},
		{"installed", true, []Statement{proposes(t, 1, agreeA), proposes(t, 0, agreeA)}, map[int]InstallReport{0: {}, 1: {}}, nil},
		{"install failed", true, []Statement{proposes(t, 1, agreeA), proposes(t, 0, agreeA)}, map[int]InstallReport{0: {}, 1: {Failed: "boom"}}, nil},
		{"later", true, []Statement{proposes(t, 0, agreeA), later(proposes(t, 1, agreeA))}, nil, nil},
		{"differ", true, []Statement{proposes(t, 0, agreeA), proposes(t, 1, agreeB)}, nil, nil},
		{"the same no", true, []Statement{keeps(1, "align_buckets=False"), keeps(0, "align_buckets=False")}, nil, nil},
		{"said different things", false, []Statement{proposes(t, 0, agreeA), later(proposes(t, 1, agreeA)), failed}, nil, nil},
		{"given up", true, []Statement{proposes(t, 0, agreeA)}, nil, &Unsettled{StoppedBy: 0, Missing: []int{1}}},
	}
	for _, g := range groups {
		for _, r := range rounds {
			v, err := Agree(&AgreeRequest{Statements: r.st, Names: agreeNames(), MayDefer: r.mayDefer, Installed: r.install, Unsettled: r.unsettle, Group: g})
			require.NoError(t, err)
			fmt.Fprintf(&b, "== round %s (group %q)\n%s\n", r.name, g.Name, logText(v.Log))
		}
	}
	ready := func(d string, bs ...[]int32) ForwardMember { return member(d, OrderReady, bs...) }
	forwards := []struct {
		name    string
		bytes   []int64
		members []ForwardMember
	}{
		{"two graphs", []int64{4, 4, 8}, []ForwardMember{ready("graph 0 (2 pieces)", []int32{1}, []int32{0}), ready("graph 1 (1 piece)", []int32{2})}},
		{"tied weight", []int64{4, 4, 8}, []ForwardMember{ready("a", []int32{1, 0}), ready("b", []int32{2}, []int32{0})}},
		{"no layout", []int64{4}, []ForwardMember{ready("a", []int32{0}), noLayout("a graph", ptr("no plan"))}},
		{"declaration", []int64{4}, []ForwardMember{member("a", OrderDeclaration, []int32{0})}},
		{"a parameter in none", []int64{4, 4}, []ForwardMember{ready("a", []int32{0})}},
		{"a position twice", []int64{4, 4}, []ForwardMember{ready("a", []int32{0}, []int32{0, 1})}},
		{"undigestible", nil, []ForwardMember{ready("a")}},
		{"no member", []int64{4}, nil},
	}
	for _, f := range forwards {
		out := planForward(t, f.bytes, f.members...)
		fmt.Fprintf(&b, "== forward %s\n%s\n", f.name, logText(&out.Note))
	}
	why := ptr("static_graph=True: DDP's buckets are fixed")
	for _, n := range []struct {
		name string
		req  PlanNotesRequest
	}{
		{"aligned, ready", PlanNotesRequest{Mode: ModeDDP, AlignRequested: true, Aligned: true}},
		{"find_unused, align off", PlanNotesRequest{Mode: ModeDDP, DDPBucketOrder: OrderDeclaration, CapsOrder: OrderDeclaration}},
		{"find_unused, torch mode", PlanNotesRequest{Mode: ModeTorch, DDPBucketOrder: OrderDeclaration}},
		{"refused", PlanNotesRequest{Mode: ModeDDP, AlignRequested: true, NotAligned: why}},
		{"not asked", PlanNotesRequest{Mode: ModeDDP, NotAligned: ptr("align_buckets=False")}},
		{"stand-in", PlanNotesRequest{Mode: ModeDDP, AlignRequested: true, StandIn: true, NotAligned: ptr("not a DDP module")}},
		{"part of a forward", PlanNotesRequest{Mode: ModeDDP, AlignRequested: true, PartOfForward: true, Frame: "frame f (a.py:3)", NotAligned: ptr("part")}},
		{"declaration caps", PlanNotesRequest{Mode: ModeDDP, AlignRequested: true, DDPBucketOrder: OrderDeclaration, Aligned: true,
			CapsOrder: OrderDeclaration, Alignment: "declaration-order caps", NumPieces: 4}},
		{"declaration caps, merged", PlanNotesRequest{Mode: ModeDDP, AlignRequested: true, DDPBucketOrder: OrderDeclaration, Aligned: true,
			CapsOrder: OrderDeclaration, Alignment: "declaration-order caps, pieces merged", MergedCuts: 2, NumPieces: 3}},
	} {
		got := NotesFor(&n.req)
		fmt.Fprintf(&b, "== notes %s\nsettings: %s\n", n.name, got.Settings)
		for _, note := range got.Notes {
			fmt.Fprintf(&b, "once=%v %s\n", note.Once, note.Text)
		}
	}
	for _, f := range followCases() {
		got, err := Follow(&f.req)
		require.NoError(t, err)
		fmt.Fprintf(&b, "== follow %s\ninstalled=%v aligned=%v reason: %s\n%s\n", f.name, got.Installed, got.Aligned, orNone(got.Reason), logText(got.Log))
	}
	return b.String()
}

func logText(l *LogLine) string {
	if l == nil {
		return "(none)"
	}
	if l.Warning {
		return "WARNING " + l.Text
	}
	return "INFO " + l.Text
}

// naiveRefusal is forwardRefusal as Note [Graphs of one forward] states
// it, the obvious way: the first member without a layout, else a set of
// orders that is not exactly {"ready"}.
func naiveRefusal(members []ForwardMember) string {
	orders := map[BucketOrder]bool{}
	for _, m := range members {
		if m.Layout == nil {
			return "no layout: " + m.Describe
		}
		orders[m.Layout.Order] = true
	}
	if len(orders) != 1 || !orders[OrderReady] {
		return "order"
	}
	return ""
}

// FuzzPlanForward: the refusals against naiveRefusal; a forward that is
// not refused has CombineForward's layout or its error, word for word.
func FuzzPlanForward(f *testing.F) {
	for i := range uint64(8) {
		f.Add(i)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, seed>>9))
		numParams := 1 + rng.IntN(6)
		bytes := make([]int64, numParams)
		for p := range bytes {
			bytes[p] = rng.Int64N(3) * 4
		}
		members := make([]ForwardMember, rng.IntN(4))
		for i := range members {
			if rng.IntN(8) == 0 {
				members[i] = noLayout(fmt.Sprintf("g%d", i), nil)
				continue
			}
			ps := rng.Perm(numParams)[:rng.IntN(numParams+1)]
			var buckets [][]int32
			for len(ps) > 0 {
				k := 1 + rng.IntN(len(ps))
				bucket := make([]int32, k)
				for j := range k {
					bucket[j] = int32(ps[j])
				}
				buckets, ps = append(buckets, bucket), ps[k:]
			}
			order := OrderReady
			if rng.IntN(8) == 0 {
				order = OrderDeclaration
			}
			members[i] = member(fmt.Sprintf("g%d", i), order, buckets...)
		}
		out := planForward(t, bytes, members...)
		want := naiveRefusal(members)
		switch {
		case strings.HasPrefix(want, "no layout: "):
			require.NotNil(t, out.Refusal)
			require.Contains(t, *out.Refusal, "("+strings.TrimPrefix(want, "no layout: ")+": ")
		case want == "order":
			require.NotNil(t, out.Refusal)
			require.Contains(t, *out.Refusal, "declaration order")
		default:
			graphs := make([]ForwardGraph, len(members))
			for i, m := range members {
				for _, b := range m.Layout.Buckets {
					graphs[i].Buckets = append(graphs[i].Buckets, b.Positions)
				}
			}
			plan, err := CombineForward(graphs, bytes)
			if err != nil {
				require.Equal(t, err.Error(), *out.Refusal)
				return
			}
			require.Nil(t, out.Refusal)
			require.Equal(t, plan.Caps, out.Layout.Caps)
			require.Equal(t, len(plan.Buckets), len(out.Layout.Buckets))
			for k, b := range plan.Buckets {
				require.True(t, slices.Equal(b.Params, out.Layout.Buckets[k].Positions))
			}
		}
		require.True(t, strings.HasPrefix(out.Note.Text, fmt.Sprintf("goddp: planning the %d graph(s) ", len(members))), out.Note.Text)
		if out.Refusal != nil {
			require.True(t, strings.HasSuffix(out.Note.Text, "; no layout: "+*out.Refusal), out.Note.Text)
		}
	})
}

func followCases() []struct {
	name string
	req  FollowRequest
} {
	same := agreeLayout(agreeA.Caps, []int32{5, 4}, []int32{3, 2}, []int32{1, 0})
	return []struct {
		name string
		req  FollowRequest
	}{
		{"later", FollowRequest{Action: ActionLater, Mine: agreeA}},
		{"keep", FollowRequest{Action: ActionKeep, Reason: ptr("align_buckets=False"), Mine: agreeA}},
		{"keep, no reason", FollowRequest{Action: ActionKeep}},
		{"install, the same layout", FollowRequest{Action: ActionInstall, Decided: agreeA, Mine: same}},
		{"install, another layout", FollowRequest{Action: ActionInstall, Decided: agreeA, Mine: agreeB}},
		{"install, none", FollowRequest{Action: ActionInstall, Decided: agreeA}},
		{"install, a part", FollowRequest{Action: ActionInstall, Decided: agreeA, Part: agreeB}},
		{"install, mine before the part", FollowRequest{Action: ActionInstall, Decided: agreeA, Mine: agreeB, Part: agreeA}},
	}
}

// TestFollowMatchesTheNaiveReference: over random requests, a later graph
// is aligned exactly when the module installed a layout whose digest is
// its own, and logs exactly when installed but not aligned.
func TestFollowMatchesTheNaiveReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 10))
	layouts := []*Layout{nil, agreeA, agreeB, agreeLayout(agreeA.Caps, []int32{5, 4}, []int32{3, 2}, []int32{1, 0})}
	for range 2000 {
		req := FollowRequest{Action: Action(rng.IntN(3)), Mine: layouts[rng.IntN(4)], Part: layouts[rng.IntN(4)], Decided: layouts[1+rng.IntN(3)]}
		got, err := Follow(&req)
		require.NoError(t, err)
		aligned := false
		if req.Action == ActionInstall && req.Mine != nil {
			mine, _ := LayoutDigest(req.Mine)
			decided, _ := LayoutDigest(req.Decided)
			aligned = mine == decided
		}
		require.Equal(t, req.Action == ActionInstall, got.Installed)
		require.Equal(t, aligned, got.Aligned)
		require.Equal(t, aligned, got.Reason == nil)
		require.Equal(t, req.Action == ActionInstall && !aligned, got.Log != nil)
	}
	_, err := Follow(&FollowRequest{Action: ActionInstall})
	require.ErrorContains(t, err, "needs its layout")
	_, err = Follow(&FollowRequest{Action: Action(9)})
	require.ErrorContains(t, err, "not a verdict")
}

// TestNotesMatchTheNaiveReference: over random requests, which notes a
// plan gets, as Note [A plan's notes] lists them.
func TestNotesMatchTheNaiveReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 3))
	flip := func() bool { return rng.IntN(2) == 0 }
	orders := []BucketOrder{OrderReady, OrderDeclaration}
	for range 2000 {
		req := PlanNotesRequest{Mode: Mode(rng.IntN(2)), AlignRequested: flip(), DDPBucketOrder: orders[rng.IntN(2)], Aligned: flip(),
			CapsOrder: orders[rng.IntN(2)], MergedCuts: rng.IntN(2), NumPieces: 1 + rng.IntN(4), StandIn: rng.IntN(4) == 0,
			PartOfForward: rng.IntN(4) == 0, Frame: "f"}
		if flip() {
			req.NotAligned = ptr("why")
		}
		got := NotesFor(&req)
		var want []string
		if req.StandIn {
			want = append(want, "stand-in")
		} else if req.PartOfForward {
			want = append(want, "part")
		} else if req.AlignRequested && req.NotAligned != nil {
			want = append(want, "straddle")
		}
		if req.Aligned && req.CapsOrder == OrderDeclaration {
			want = append(want, "declaration")
		}
		require.Len(t, got.Notes, len(want), "%+v", req)
		for i, w := range want {
			n := got.Notes[i]
			require.Equal(t, w != "part", n.Once)
			switch w {
			case "straddle":
				require.Contains(t, n.Text, "may straddle the cuts: why")
			case "declaration":
				require.Equal(t, req.MergedCuts > 0, strings.Contains(n.Text, "pieces were merged"))
			}
		}
		require.Equal(t, req.Mode == ModeDDP && !req.AlignRequested && req.DDPBucketOrder == OrderDeclaration, got.Settings != "")
	}
}

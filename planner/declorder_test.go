package planner

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// naiveInitialBuckets is a plain reference for the buckets DDP builds at
// construction (torch 2.15: _ddp_init_helper over
// compute_bucket_assignment_by_size, checked against torch in
// tests/python/distributed/test_dist_dtype_groups.py): walk the parameters
// in declaration order, add each to its (dtype, device) group's open
// bucket, close that bucket once its bytes reach the group's current cap
// (each group walks the caps from the first, the last repeating), list
// every bucket by its first position, then reverse the list: DDP order,
// the last-declared first. Each bucket is a set of parameter indices.
func naiveInitialBuckets(g *Graph, caps []int64) []map[int32]bool {
	var order []int32
	for p := range g.Params {
		if g.Params[p].counted() {
			order = append(order, int32(p))
		}
	}
	slices.SortFunc(order, func(a, b int32) int { return int(g.Params[a].DDPPosition - g.Params[b].DDPPosition) })
	type key struct{ dtype, device int32 }
	type filling struct {
		first  int
		params map[int32]bool
		size   int64
		capIdx int
	}
	fills := map[key]*filling{}
	type built struct {
		first  int
		params map[int32]bool
	}
	var buckets []built
	for pos, p := range order {
		k := key{g.Params[p].DType, g.Params[p].Device}
		f := fills[k]
		if f == nil {
			f = &filling{}
			fills[k] = f
		}
		if f.params == nil {
			f.first, f.params = pos, map[int32]bool{}
		}
		f.params[p] = true
		f.size += g.Params[p].Bytes
		if f.size >= caps[f.capIdx] {
			buckets = append(buckets, built{f.first, f.params})
			f.params, f.size = nil, 0
			f.capIdx = min(f.capIdx+1, len(caps)-1)
		}
	}
	for _, f := range fills {
		if f.params != nil {
			buckets = append(buckets, built{f.first, f.params})
		}
	}
	slices.SortFunc(buckets, func(a, b built) int { return b.first - a.first })
	var out []map[int32]bool
	for _, b := range buckets {
		out = append(out, b.params)
	}
	return out
}

// setDDPPositions gives the counted parameters the DDP positions perm
// lists (perm[k] is the parameter at position k) and -1 to the others.
func setDDPPositions(g *Graph, perm []int32) {
	for p := range g.Params {
		g.Params[p].DDPPosition = -1
	}
	for k, p := range perm {
		g.Params[p].DDPPosition = int32(k)
	}
}

func countedParams(g *Graph) []int32 {
	var out []int32
	for p := range g.Params {
		if g.Params[p].counted() {
			out = append(out, int32(p))
		}
	}
	return out
}

// mostLaunchPoints is a brute-force reference: over every way of cutting
// the declaration order into contiguous buckets (what caps can do), the
// most distinct pieces at whose backward end DDP, launching its buckets in
// order, starts one. label is each declared parameter's piece.
func mostLaunchPoints(label []int32) int {
	n := len(label)
	best := 0
	for mask := 0; mask < 1<<max(n-1, 0); mask++ {
		// Bucket starts: position 0 and every k with bit k-1 set. DDP order
		// runs from the last bucket; each launches at the smallest piece
		// seen so far.
		seen := map[int32]bool{}
		running := int32(1 << 30)
		for k := n - 1; k >= 0; k-- {
			running = min(running, label[k])
			if k == 0 || mask&(1<<(k-1)) != 0 {
				seen[running] = true
			}
		}
		best = max(best, len(seen))
	}
	return best
}

// checkDeclarationAligned checks a plan made under OrderDeclaration with
// AlignBuckets against the ready-order plan of the same graph: DDP's
// construction-time bucketing with the plan's DDPCaps yields exactly the
// plan's buckets; launching them in DDP order, bucket k starts exactly when
// backward finishes piece N-1-k, so every piece starts one; the cuts are
// the ready-order plan's, minus the fewest any caps would need to drop.
func checkDeclarationAligned(t *testing.T, g *Graph, ready, decl *Plan) {
	t.Helper()
	if len(decl.Buckets) == 0 {
		return
	}
	if len(decl.DDPCaps) != len(decl.Buckets) {
		t.Fatalf("%d caps for %d buckets", len(decl.DDPCaps), len(decl.Buckets))
	}
	checkIsDDPsWalk(t, g, decl, decl.DDPCaps)
	firstUse, _ := firstUses(g)
	running := int32(1 << 30)
	for k, b := range decl.Buckets {
		for _, p := range b.Params {
			if f := firstUse[p]; f >= 0 {
				running = min(running, decl.NodePiece[f])
			}
		}
		want := decl.NumPieces - 1 - k
		if b.Piece != want || (running != int32(want) && running != 1<<30) {
			t.Fatalf("bucket %d: piece %d, launches after piece %d; want both %d", k, b.Piece, running, want)
		}
	}
	if len(decl.Buckets) != decl.NumPieces {
		t.Fatalf("%d buckets for %d pieces", len(decl.Buckets), decl.NumPieces)
	}
	// Every kept cut is a ready-order cut, and no more were dropped than needed.
	checkKeptCuts(t, ready, decl)
	order := declarationOrder(g)
	if len(order) <= 12 {
		label := declaredPieces(order, firstUse, ready.NodePiece, ready.NumPieces)
		if want := mostLaunchPoints(label); decl.NumPieces != want {
			t.Fatalf("%d pieces start a bucket; caps can make %d", decl.NumPieces, want)
		}
	}
	wantAlign := AlignDeclaration
	if decl.MergedCuts > 0 {
		wantAlign = AlignDeclarationMerged
	}
	if decl.Alignment != wantAlign {
		t.Fatalf("alignment %v, want %v", decl.Alignment, wantAlign)
	}
}

// checkDeclarationGroups checks a plan of several (dtype, device) groups
// made under OrderDeclaration with AlignBuckets against the ready-order
// plan of the same graph (Note [Declaration order per group]): DDP's
// construction-time bucketing with the plan's DDPCaps yields exactly the
// plan's buckets, in DDP's order; each bucket holds one group and names
// the piece at whose backward end DDP, launching in order, starts it; every
// piece starts one; the cuts are ready-order cuts, MergedCuts of them gone.
func checkDeclarationGroups(t *testing.T, g *Graph, ready, decl *Plan) {
	t.Helper()
	if decl.Alignment != AlignDeclarationGroups {
		t.Fatalf("alignment %v, want %v", decl.Alignment, AlignDeclarationGroups)
	}
	for j, c := range decl.DDPCaps {
		if c < 1 {
			t.Fatalf("cap %d is %d bytes", j, c)
		}
	}
	checkIsDDPsWalk(t, g, decl, decl.DDPCaps)
	firstUse, _ := firstUses(g)
	running := int32(1 << 30)
	starts := map[int]bool{}
	for k, b := range decl.Buckets {
		for _, p := range b.Params {
			if g.Params[p].DType != b.DType || g.Params[p].Device != b.Device {
				t.Fatalf("bucket %d mixes groups", k)
			}
			piece := int32(decl.NumPieces - 1) // unused: ready as backward starts
			if f := firstUse[p]; f >= 0 {
				piece = decl.NodePiece[f]
			}
			running = min(running, piece)
		}
		if b.Piece != int(running) {
			t.Fatalf("bucket %d names piece %d; DDP launches it after piece %d", k, b.Piece, running)
		}
		starts[b.Piece] = true
	}
	if len(starts) != decl.NumPieces {
		t.Fatalf("%d pieces, %d of them start a bucket", decl.NumPieces, len(starts))
	}
	checkKeptCuts(t, ready, decl)
}

// checkIsDDPsWalk: DDP's construction-time bucketing with caps
// (naiveInitialBuckets) yields exactly pl's buckets, in DDP order.
func checkIsDDPsWalk(t *testing.T, g *Graph, pl *Plan, caps []int64) {
	t.Helper()
	got := naiveInitialBuckets(g, caps)
	if len(got) != len(pl.Buckets) {
		t.Fatalf("DDP would build %d buckets with caps %v; the plan has %d: %v", len(got), caps, len(pl.Buckets), pl.Buckets)
	}
	for k, b := range pl.Buckets {
		if len(b.Params) != len(got[k]) || slices.ContainsFunc(b.Params, func(p int32) bool { return !got[k][p] }) {
			t.Fatalf("bucket %d: plan %v, DDP %v", k, b.Params, got[k])
		}
	}
}

// checkKeptCuts: every cut of decl is a ready-order cut, and MergedCuts
// counts the ones that went.
func checkKeptCuts(t *testing.T, ready, decl *Plan) {
	t.Helper()
	readyCuts, declCuts := cutsOf(ready), cutsOf(decl)
	for _, c := range declCuts {
		if !slices.Contains(readyCuts, c) {
			t.Fatalf("cut at node %d is not one of the ready-order cuts %v", c, readyCuts)
		}
	}
	if decl.MergedCuts != len(readyCuts)-len(declCuts) {
		t.Fatalf("MergedCuts %d, but %d of %d cuts went", decl.MergedCuts, len(readyCuts)-len(declCuts), len(readyCuts))
	}
}

// cutsOf returns the first node of every piece but the first.
func cutsOf(pl *Plan) []int {
	var cuts []int
	prev := int32(-1)
	for i, q := range pl.NodePiece {
		if q < 0 {
			continue
		}
		if prev >= 0 && q != prev {
			cuts = append(cuts, i)
		}
		prev = q
	}
	return cuts
}

// readyAndDeclarationPlans plans g with aligned 200 kB buckets twice: in
// DDP's ready order and in its declaration order.
func readyAndDeclarationPlans(t *testing.T, g *Graph) (ready, decl *Plan) {
	t.Helper()
	cfg := Config{BucketCapBytes: 200_000, FirstBucketCapBytes: 200_000, AlignBuckets: true}
	ready, err := Build(g, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.BucketOrder = OrderDeclaration
	if decl, err = Build(g, cfg); err != nil {
		t.Fatal(err)
	}
	return ready, decl
}

// TestDeclarationOrderMatchingForwardKeepsEveryCut: a linear stack
// declared in forward order (every nn.Sequential, GPT-2's blocks) keeps
// the ready-order cuts, and its caps are the pieces' bytes, forward-first
// piece first.
func TestDeclarationOrderMatchingForwardKeepsEveryCut(t *testing.T) {
	g := linearStack(f32, linearLayer{256, 256, 0}, linearLayer{256, 256, 0}, linearLayer{256, 256, 0}, linearLayer{256, 10, 0}).graph()
	setDDPPositions(g, countedParams(g))
	ready, decl := readyAndDeclarationPlans(t, g)
	if ready.NumPieces < 3 {
		t.Fatalf("want a plan with several pieces, got %d", ready.NumPieces)
	}
	if decl.Alignment != AlignDeclaration || decl.MergedCuts != 0 {
		t.Fatalf("alignment %v, %d cuts merged; want declaration-order caps without merging", decl.Alignment, decl.MergedCuts)
	}
	if !slices.Equal(decl.NodePiece, ready.NodePiece) {
		t.Fatalf("pieces changed: %v, ready-order %v", decl.NodePiece, ready.NodePiece)
	}
	// Forward-first piece first: the reverse of the ready-order caps.
	want := slices.Clone(ready.DDPCaps)
	slices.Reverse(want)
	if !slices.Equal(decl.DDPCaps, want) {
		t.Fatalf("caps %v, want %v", decl.DDPCaps, want)
	}
	if ready.Alignment != AlignReady {
		t.Fatalf("ready-order plan: alignment %v", ready.Alignment)
	}
	checkDeclarationAligned(t, g, ready, decl)
	if decl.Fingerprint == ready.Fingerprint {
		t.Fatal("the bucket order does not reach the fingerprint")
	}
}

// TestDeclarationOrderInterleavedMergesOnlyWhatItMust: fc3 declared
// before fc2 lets no bucket start when fc3's piece ends, so that one cut
// goes; a head (fc4) declared first joins fc1's bucket and costs only its
// own cut. The cuts before stay.
func TestDeclarationOrderInterleavedMergesOnlyWhatItMust(t *testing.T) {
	for _, tc := range []struct {
		name  string
		order []int // layers in declaration order
	}{
		{"fc3 before fc2", []int{0, 2, 1, 3}},
		{"head first", []int{3, 0, 1, 2}},
	} {
		b := linearStack(f32, linearLayer{256, 256, 0}, linearLayer{256, 256, 0}, linearLayer{256, 256, 0}, linearLayer{256, 256, 0})
		g := b.graph()
		counted := countedParams(g)
		var perm []int32
		for _, l := range tc.order {
			perm = append(perm, counted[2*l], counted[2*l+1])
		}
		setDDPPositions(g, perm)
		ready, decl := readyAndDeclarationPlans(t, g)
		if ready.NumPieces != 4 {
			t.Fatalf("%s: ready-order plan has %d pieces, want one per layer", tc.name, ready.NumPieces)
		}
		if decl.Alignment != AlignDeclarationMerged || decl.MergedCuts != 1 || decl.NumPieces != 3 {
			t.Fatalf("%s: alignment %v, %d merged, %d pieces; want one cut merged", tc.name, decl.Alignment, decl.MergedCuts, decl.NumPieces)
		}
		checkDeclarationAligned(t, g, ready, decl)
	}
}

// TestDeclarationOrderRandomPlans: random graphs, random declaration
// orders (and, one time in four, the forward order), unused parameters
// and several (dtype, device) groups included.
func TestDeclarationOrderRandomPlans(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 7))
	checked, grouped := 0, 0
	forRandomFuzzInputs(t, rng, 1500, 300, func(data []byte) {
		// ModeDDP, AlignBuckets, no corruption; mixed keys kept one time in two.
		data[0] = 0x02 | (data[1]&1)<<2
		g, cfg := decodeFuzzInput(data)
		counted := countedParams(g)
		_, keys := paramKeys(g, counted)
		zeroBytes := slices.ContainsFunc(counted, func(p int32) bool { return g.Params[p].Bytes == 0 })
		perm := slices.Clone(counted)
		if rng.IntN(4) > 0 {
			rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
		}
		setDDPPositions(g, perm)
		ready, err := Build(g, cfg)
		if err != nil {
			t.Fatalf("ready order: %v", err)
		}
		cfg.BucketOrder = OrderDeclaration
		decl, err := Build(g, cfg)
		if err != nil {
			t.Fatalf("declaration order: %v", err)
		}
		again, err := Build(g, cfg)
		if err != nil || again.Fingerprint != decl.Fingerprint {
			t.Fatalf("not deterministic: %v", err)
		}
		if len(keys) > 1 && len(decl.Buckets) > 0 {
			checkDeclarationGroups(t, g, ready, decl)
			grouped++
			return
		}
		if zeroBytes && len(decl.Buckets) == 0 {
			return
		}
		if zeroBytes {
			// Zero-byte parameters are the documented exception to one
			// bucket per piece (doc.go, "Aligned buckets"): a zero-byte
			// gradient after its piece's bytes joins the next bucket. The
			// plan is still DDP's walk with its caps, as DDP gets them (at
			// least 1 byte: Decide's clampCaps).
			caps := slices.Clone(decl.DDPCaps)
			for j := range caps {
				caps[j] = max(1, caps[j])
			}
			checkIsDDPsWalk(t, g, decl, caps)
			return
		}
		checkDeclarationAligned(t, g, ready, decl)
		if decl.MergedCuts > 0 {
			checked++
		}
	})
	if !testing.Short() && grouped < 100 {
		t.Fatalf("%d random cases of several groups", grouped)
	}
	if checked == 0 && !testing.Short() {
		t.Fatal("no random case needed a merge: the generator does not exercise merging")
	}
}

// TestDeclarationOrderValidation: bad positions and bad configs are
// reported, naming what is wrong.
func TestDeclarationOrderValidation(t *testing.T) {
	base := func() *Graph {
		g := linearStack(f32, linearLayer{8, 8, 0}, linearLayer{8, 8, 0}).graph()
		setDDPPositions(g, countedParams(g))
		return g
	}
	cfg := Config{BucketCapBytes: 100, FirstBucketCapBytes: 100, AlignBuckets: true, BucketOrder: OrderDeclaration}
	cases := []struct {
		name  string
		edit  func(*Graph, *Config)
		code  ErrorCode
		words string
	}{
		{"missing position", func(g *Graph, _ *Config) { g.Params[1].DDPPosition = -1 }, ErrInvalidGraph, "has no DDP position"},
		{"shared position", func(g *Graph, _ *Config) { g.Params[1].DDPPosition = g.Params[0].DDPPosition }, ErrInvalidGraph, "share DDP position"},
		{"negative position", func(g *Graph, _ *Config) { g.Params[1].DDPPosition = -5 }, ErrInvalidGraph, "DDP position -5"},
		{"unknown order", func(_ *Graph, c *Config) { c.BucketOrder = 7 }, ErrInvalidConfig, "valid: 0 = OrderReady, 1 = OrderDeclaration"},
		{"torch mode", func(_ *Graph, c *Config) { c.Mode, c.AlignBuckets = ModeTorch, false }, ErrInvalidConfig, "BucketOrder is not supported in ModeTorch"},
		// A counted parameter that no node uses still joins a declaration-order bucket.
		{"unused bytes overflow", func(g *Graph, _ *Config) {
			g.Params = append(g.Params, Param{Name: "unused", Bytes: math.MaxInt64, StorageBytes: math.MaxInt64,
				RequiresGrad: true, DDPPosition: int32(len(g.Params))})
		}, ErrOverflow, "overflow int64"},
	}
	for _, tc := range cases {
		g, c := base(), cfg
		tc.edit(g, &c)
		_, err := Build(g, c)
		e, ok := err.(*Error)
		if !ok || e.Code != tc.code || !contains(e.Msg, tc.words) {
			t.Errorf("%s: got %v, want code %d mentioning %q", tc.name, err, tc.code, tc.words)
		}
	}
	// Positions are not read under the ready order.
	g := base()
	g.Params[0].DDPPosition = -1
	if _, err := Build(g, Config{BucketCapBytes: 100, FirstBucketCapBytes: 100}); err != nil {
		t.Fatalf("ready order read the positions: %v", err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

package planner

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// naiveInitialBuckets is a plain reference for the buckets DDP builds at
// construction (torch 2.15: _ddp_init_helper over
// compute_bucket_assignment_by_size, one (dtype, device) key): walk the
// parameters in declaration order, add each to the open bucket, close the
// bucket once its bytes reach the current cap (the last cap repeating),
// then list the buckets last-declared first. Each bucket is a set of
// parameter indices.
func naiveInitialBuckets(g *Graph, caps []int64) []map[int32]bool {
	var order []int32
	for p := range g.Params {
		if g.Params[p].counted() {
			order = append(order, int32(p))
		}
	}
	slices.SortFunc(order, func(a, b int32) int { return int(g.Params[a].DDPPosition - g.Params[b].DDPPosition) })
	var buckets []map[int32]bool
	open, size, capIdx := map[int32]bool{}, int64(0), 0
	for _, p := range order {
		open[p] = true
		size += g.Params[p].Bytes
		if size >= caps[capIdx] {
			buckets = append(buckets, open)
			open, size = map[int32]bool{}, 0
			capIdx = min(capIdx+1, len(caps)-1)
		}
	}
	if len(open) > 0 {
		buckets = append(buckets, open)
	}
	slices.Reverse(buckets)
	return buckets
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

// minimalMerge is a brute-force reference for mergedBoundaries: the fewest
// boundaries (between pieces b and b+1) whose removal makes the
// declaration-order piece labels non-decreasing.
func minimalMerge(label []int32, numPieces int) int {
	nb := numPieces - 1
	best := nb
	for mask := 0; mask < 1<<nb; mask++ {
		group := make([]int32, numPieces)
		for q := 1; q < numPieces; q++ {
			group[q] = group[q-1]
			if mask&(1<<(q-1)) == 0 {
				group[q]++
			}
		}
		ok := true
		for k := 1; k < len(label); k++ {
			if group[label[k]] < group[label[k-1]] {
				ok = false
				break
			}
		}
		dropped := 0
		for b := 0; b < nb; b++ {
			if mask&(1<<b) != 0 {
				dropped++
			}
		}
		if ok && dropped < best {
			best = dropped
		}
	}
	return best
}

// checkDeclarationAligned checks a plan made under OrderDeclaration with
// AlignBuckets against the ready-order plan of the same graph: DDP's
// construction-time bucketing with the plan's DDPCaps yields exactly the
// plan's buckets; bucket k holds the parameters first used in piece N-1-k;
// the cuts are the ready-order plan's minus the fewest needed.
func checkDeclarationAligned(t *testing.T, g *Graph, ready, decl *Plan) {
	t.Helper()
	if len(decl.Buckets) == 0 {
		return
	}
	if len(decl.DDPCaps) != len(decl.Buckets) {
		t.Fatalf("%d caps for %d buckets", len(decl.DDPCaps), len(decl.Buckets))
	}
	got := naiveInitialBuckets(g, decl.DDPCaps)
	if len(got) != len(decl.Buckets) {
		t.Fatalf("DDP would build %d buckets with caps %v; the plan has %d", len(got), decl.DDPCaps, len(decl.Buckets))
	}
	for k, b := range decl.Buckets {
		if len(b.Params) != len(got[k]) {
			t.Fatalf("bucket %d: plan %v, DDP %v", k, b.Params, got[k])
		}
		for _, p := range b.Params {
			if !got[k][p] {
				t.Fatalf("bucket %d: plan %v, DDP %v", k, b.Params, got[k])
			}
		}
		if b.Piece != decl.NumPieces-1-k {
			t.Fatalf("bucket %d completed by piece %d, want %d", k, b.Piece, decl.NumPieces-1-k)
		}
	}
	for q, firstUsed := range firstUsePieces(g, decl) {
		bucket := decl.Buckets[decl.NumPieces-1-q]
		for p := range firstUsed {
			if !slices.Contains(bucket.Params, p) {
				t.Fatalf("parameter %d first used in piece %d is not in its bucket %v", p, q, bucket.Params)
			}
		}
	}
	// Every kept cut is a ready-order cut, and no more were dropped than needed.
	readyCuts := cutsOf(ready)
	declCuts := cutsOf(decl)
	for _, c := range declCuts {
		if !slices.Contains(readyCuts, c) {
			t.Fatalf("cut at node %d is not one of the ready-order cuts %v", c, readyCuts)
		}
	}
	if decl.MergedCuts != len(readyCuts)-len(declCuts) {
		t.Fatalf("MergedCuts %d, but %d of %d cuts went", decl.MergedCuts, len(readyCuts)-len(declCuts), len(readyCuts))
	}
	if ready.NumPieces <= 13 {
		firstUse, _ := firstUses(g)
		label := declaredPieces(declarationOrder(g), firstUse, ready.NodePiece)
		if want := minimalMerge(label, ready.NumPieces); decl.MergedCuts != want {
			t.Fatalf("dropped %d cuts; %d suffice", decl.MergedCuts, want)
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

// TestDeclarationOrderMatchingForwardKeepsEveryCut: a linear stack
// declared in forward order (every nn.Sequential, GPT-2's blocks) keeps
// the ready-order cuts, and its caps are the pieces' bytes, forward-first
// piece first.
func TestDeclarationOrderMatchingForwardKeepsEveryCut(t *testing.T) {
	g := linearStack(f32, linearLayer{256, 256, 0}, linearLayer{256, 256, 0}, linearLayer{256, 256, 0}, linearLayer{256, 10, 0}).graph()
	setDDPPositions(g, countedParams(g))
	cfg := Config{BucketCapBytes: 200_000, FirstBucketCapBytes: 200_000, AlignBuckets: true}
	ready, err := Build(g, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.BucketOrder = OrderDeclaration
	decl, err := Build(g, cfg)
	if err != nil {
		t.Fatal(err)
	}
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

// TestDeclarationOrderHeadFirstMergesOnlyWhatItMust: the output layer
// declared first (a classifier head defined before the body) forces every
// piece between the head's and the first layer's into one; the cuts
// before that stay.
func TestDeclarationOrderHeadFirstMergesOnlyWhatItMust(t *testing.T) {
	b := linearStack(f32, linearLayer{256, 256, 0}, linearLayer{256, 256, 0}, linearLayer{256, 256, 0}, linearLayer{256, 256, 0})
	g := b.graph()
	counted := countedParams(g)
	// fc3 declared before fc2: one inversion between two adjacent layers.
	perm := []int32{counted[0], counted[1], counted[4], counted[5], counted[2], counted[3], counted[6], counted[7]}
	setDDPPositions(g, perm)
	cfg := Config{BucketCapBytes: 200_000, FirstBucketCapBytes: 200_000, AlignBuckets: true}
	ready, err := Build(g, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.BucketOrder = OrderDeclaration
	decl, err := Build(g, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ready.NumPieces != 4 {
		t.Fatalf("ready-order plan has %d pieces, want one per layer", ready.NumPieces)
	}
	if decl.Alignment != AlignDeclarationMerged || decl.MergedCuts != 1 || decl.NumPieces != 3 {
		t.Fatalf("alignment %v, %d merged, %d pieces; want the fc2|fc3 cut merged only", decl.Alignment, decl.MergedCuts, decl.NumPieces)
	}
	checkDeclarationAligned(t, g, ready, decl)
}

// TestDeclarationOrderRandomPlans: random graphs, random declaration
// orders (and, one time in four, the forward order), unused parameters
// included.
func TestDeclarationOrderRandomPlans(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 7))
	checked := 0
	forRandomFuzzInputs(t, rng, 1500, 300, func(data []byte) {
		data[0] = 0x02 // ModeDDP, AlignBuckets, one key, no corruption
		g, cfg := decodeFuzzInput(data)
		counted := countedParams(g)
		for _, p := range counted {
			if g.Params[p].Bytes == 0 {
				// Zero-byte parameters are the documented exception to exact
				// alignment (doc.go, "Aligned buckets").
				return
			}
		}
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
		checkDeclarationAligned(t, g, ready, decl)
		if decl.MergedCuts > 0 {
			checked++
		}
	})
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

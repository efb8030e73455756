package planner

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bodyBuilder writes checkpoint bodies for the tests, in graph order.
type bodyBuilder struct{ nodes []BodyNode }

func (b *bodyBuilder) add(n BodyNode) int32 {
	b.nodes = append(b.nodes, n)
	return int32(len(b.nodes) - 1)
}

func (b *bodyBuilder) placeholder() int32 {
	return b.add(BodyNode{Kind: BodyPlaceholder, Block: -1, Writes: -1, Carries: true})
}

func (b *bodyBuilder) attr(block int32) int32 {
	return b.add(BodyNode{Kind: BodyGetAttr, Block: block, Writes: -1, Carries: true})
}

// op adds a compute node; name is for the reader (the planner reads no op).
func (b *bodyBuilder) op(name string, block int32, inputs ...int32) int32 {
	return b.add(BodyNode{Kind: BodyCompute, Block: block, Inputs: inputs, Writes: -1, Carries: true})
}

// call ends the body with an output that returns results.
func (b *bodyBuilder) call(name string, results ...int32) CheckpointCall {
	for _, r := range results {
		b.nodes[r].Returned = true
	}
	b.add(BodyNode{Kind: BodyOutput, Block: -1, Inputs: results, Writes: -1})
	return CheckpointCall{Name: name, Nodes: b.nodes, IndexedOnly: true}
}

// stackBody is x -> relu (block 0) -> neg, sin (block 1) -> out, with the
// blocks given.
func stackBody(name string, blocks ...int32) CheckpointCall {
	b := &bodyBuilder{}
	x := b.placeholder()
	r := b.op("relu", blocks[0], x)
	n := b.op("neg", blocks[1], r)
	s := b.op("sin", blocks[2], n)
	return b.call(name, s)
}

func decide(t *testing.T, req *SplitRequest) *SplitReply {
	t.Helper()
	r, err := SplitCheckpoints(req)
	require.NoError(t, err)
	return r
}

func one(t *testing.T, c CheckpointCall) CheckpointSplit {
	t.Helper()
	r := decide(t, &SplitRequest{Calls: []CheckpointCall{c}})
	require.Equal(t, AskNothing, r.Ask)
	require.Len(t, r.Calls, 1)
	return r.Calls[0]
}

func TestCheckpointSplitAtBlocks(t *testing.T) {
	s := one(t, stackBody("checkpoint", 0, 1, 1))
	assert.Equal(t, "block", s.Boundary)
	assert.Equal(t, 2, s.Blocks)
	assert.Equal(t, SplitDone, s.Code)
	assert.Equal(t, []int32{-1, 0, 1, 1, -1}, s.NodeRegion)
	assert.Equal(t, []CheckpointRegion{{Inputs: []int32{0}, Outputs: []int32{1}}, {Inputs: []int32{1}, Outputs: []int32{3}}}, s.Regions)
	assert.Equal(t, []int32{-1, -1}, []int32{s.Node, int32(s.Region)}, "a split names no node or region")
}

func TestCheckpointRegionsFollowRuns(t *testing.T) {
	b := &bodyBuilder{}
	x, w := b.placeholder(), b.placeholder()
	pre := b.op("mul", -1, x, w)   // before the first group: the first region
	a := b.op("relu", 0, pre)      // block 0
	gap := b.op("neg", -1, a)      // joins block 0's run
	c := b.attr(-1)                // goes where its first user is
	d := b.op("add", 1, gap, c, x) // block 1
	e := b.op("add", 0, d, pre)    // block 0 again: a new region
	f := b.op("sin", 0, e)         //
	s := one(t, b.call("checkpoint_1", f, d))
	require.Equal(t, SplitDone, s.Code)
	assert.Equal(t, []int32{-1, -1, 0, 0, 0, 1, 1, 2, 2, -1}, s.NodeRegion)
	assert.Equal(t, []CheckpointRegion{
		{Inputs: []int32{x, w}, Outputs: []int32{pre, gap}},
		{Inputs: []int32{gap, x}, Outputs: []int32{d}},
		{Inputs: []int32{d, pre}, Outputs: []int32{f}},
	}, s.Regions)
}

func TestCheckpointKeptWhole(t *testing.T) {
	cases := []struct {
		name   string
		call   func() CheckpointCall
		code   KeptWhole
		node   int32 // the body node the reason names
		region int   // the region it names
	}{
		{"one block", func() CheckpointCall { return stackBody("c", 0, 0, 0) }, WholeFewBlocks, -1, -1},
		{"result used", func() CheckpointCall {
			c := stackBody("c", 0, 1, 1)
			c.IndexedOnly = false
			return c
		}, WholeResultUsed, -1, -1},
		{"policy", func() CheckpointCall {
			c := stackBody("c", 0, 1, 1)
			c.PolicyFunction = true
			return c
		}, WholePolicy, -1, -1},
		{"random", func() CheckpointCall {
			c := stackBody("c", 0, 1, 1)
			c.Nodes[2].Random = true
			return c
		}, WholeRandom, 2, -1},
		{"state", func() CheckpointCall {
			c := stackBody("c", 0, 1, 1)
			c.Nodes[3].StateChange = true
			return c
		}, WholeStateChange, -1, -1},
		{"nested", func() CheckpointCall {
			c := stackBody("c", 0, 1, 1)
			c.Nodes[1].Nested = true
			return c
		}, WholeNested, -1, -1},
		{"attribute on both sides", func() CheckpointCall {
			b := &bodyBuilder{}
			x := b.placeholder()
			c := b.attr(-1)
			r := b.op("add", 0, x, c)
			return b.call("c", b.op("add", 1, r, c))
		}, WholeAttribute, -1, -1},
		{"not carried", func() CheckpointCall {
			b := &bodyBuilder{}
			x := b.placeholder()
			size := b.op("size", 0, x)
			b.nodes[size].Carries = false
			return b.call("c", b.op("view", 1, x, size))
		}, WholeNotCarried, 1, -1},
		{"mutation", func() CheckpointCall {
			b := &bodyBuilder{}
			x := b.placeholder()
			r := b.op("relu", 0, x)
			add := b.op("add_", 1, r)
			b.nodes[add].Writes = r
			return b.call("c", add)
		}, WholeMutation, 2, -1},
		{"a placeholder written", func() CheckpointCall {
			b := &bodyBuilder{}
			x := b.placeholder()
			r := b.op("relu", 0, x)
			add := b.op("iadd", 1, x, r)
			b.nodes[add].Writes = x
			return b.call("c", add)
		}, WholeMutation, 2, -1},
		{"nothing on", func() CheckpointCall {
			b := &bodyBuilder{}
			x := b.placeholder()
			b.op("relu", 0, x)
			return b.call("c", b.op("neg", 1, x))
		}, WholeNothingOn, -1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := one(t, tc.call())
			assert.Equal(t, tc.code, s.Code)
			assert.Equal(t, tc.node, s.Node, "node")
			assert.Equal(t, tc.region, s.Region, "region")
			assert.Nil(t, s.NodeRegion)
			assert.Nil(t, s.Regions)
			if tc.code == WholeFewBlocks {
				assert.Equal(t, "", s.Boundary)
			} else {
				assert.Equal(t, "block", s.Boundary)
				assert.Equal(t, 2, s.Blocks)
			}
		})
	}
}

func TestCheckpointBlockersComeInOrder(t *testing.T) {
	c := stackBody("c", 0, 1, 1)
	c.IndexedOnly, c.PolicyFunction = false, true
	c.Nodes[1].Random = true
	assert.Equal(t, WholeResultUsed, one(t, c).Code)
	c.IndexedOnly = true
	assert.Equal(t, WholePolicy, one(t, c).Code)
	c.PolicyFunction = false
	c.Nodes[1].Nested, c.Nodes[2].StateChange = true, true
	assert.Equal(t, WholeRandom, one(t, c).Code, "the first node's first blocker")
	c.Nodes[1].Random = false
	assert.Equal(t, WholeNested, one(t, c).Code, "node by node, not blocker by blocker")
	c.Nodes[1].Nested = false
	assert.Equal(t, WholeStateChange, one(t, c).Code)
	c.Nodes[0].Random = true // a placeholder's facts are not read
	c.Nodes[1].Nested, c.Nodes[2].StateChange = false, false
	assert.Equal(t, SplitDone, one(t, c).Code)
}

// bucketed plans c's body by buckets: per node its piece.
func bucketed(c CheckpointCall, regions bool, pieces ...int32) CheckpointCall {
	c.Buckets = &BodyBuckets{Pieces: pieces, ParamBytes: 3 << 20, CapBytes: 1 << 20, Buckets: 3, Regions: regions}
	return c
}

func TestCheckpointCombination(t *testing.T) {
	yes, no := true, false
	few := stackBody("few", -1, -1, -1)
	many := stackBody("many", 0, 1, 1)
	t.Run("a block split: no question", func(t *testing.T) {
		r := decide(t, &SplitRequest{Calls: []CheckpointCall{few, many}, BucketSplits: true})
		assert.Equal(t, AskNothing, r.Ask)
		assert.Equal(t, []int{1}, r.Said)
		assert.Equal(t, "", r.Calls[0].Boundary)
	})
	t.Run("no bucket splits: no question", func(t *testing.T) {
		r := decide(t, &SplitRequest{Calls: []CheckpointCall{few}})
		assert.Equal(t, AskNothing, r.Ask)
		assert.Empty(t, r.Said)
	})
	t.Run("only calls with blocks: no question", func(t *testing.T) {
		m := many
		m.IndexedOnly = false
		r := decide(t, &SplitRequest{Calls: []CheckpointCall{m}, BucketSplits: true})
		assert.Equal(t, AskNothing, r.Ask)
		assert.Equal(t, []int{0}, r.Said)
	})
	m := many
	m.IndexedOnly = false // many stays whole, so buckets are tried
	calls := []CheckpointCall{few, m, few}
	r := decide(t, &SplitRequest{Calls: calls, BucketSplits: true})
	require.Equal(t, AskCutAtBlocks, r.Ask)
	assert.Empty(t, r.Calls)
	r = decide(t, &SplitRequest{Calls: calls, BucketSplits: true, CutAtBlocks: &yes})
	assert.Equal(t, AskNothing, r.Ask, "a graph cut at block runs is not split at buckets")
	assert.Equal(t, []int{1}, r.Said)
	r = decide(t, &SplitRequest{Calls: calls, BucketSplits: true, CutAtBlocks: &no})
	require.Equal(t, AskBuckets, r.Ask)
	assert.Equal(t, []int{0, 2}, r.PlanBuckets)
	calls = []CheckpointCall{bucketed(few, true, -1, 0, 1, 1, -1), m, bucketed(few, false, -1, 0, 0, 0, -1)}
	r = decide(t, &SplitRequest{Calls: calls, BucketSplits: true, CutAtBlocks: &no, BucketsPlanned: true})
	require.Equal(t, AskNothing, r.Ask)
	assert.Equal(t, []int{0, 1}, r.Said, "a body of one piece has nothing to say")
	s := r.Calls[0]
	assert.Equal(t, "bucket", s.Boundary)
	assert.Equal(t, []int32{-1, 0, 1, 1, -1}, s.NodeRegion)
	assert.Len(t, s.Regions, 2)
	assert.Equal(t, "block", r.Calls[1].Boundary)
	// A call planned but holding no DDP parameter (Buckets nil) says nothing.
	calls[0].Buckets = nil
	r = decide(t, &SplitRequest{Calls: calls, BucketSplits: true, CutAtBlocks: &no, BucketsPlanned: true})
	assert.Equal(t, []int{1}, r.Said)
}

func TestCheckpointSplitRefusesBadBodies(t *testing.T) {
	good := stackBody("c", 0, 1, 1)
	bad := map[string]func(c *CheckpointCall){
		"no output":      func(c *CheckpointCall) { c.Nodes = c.Nodes[:len(c.Nodes)-1] },
		"empty":          func(c *CheckpointCall) { c.Nodes = nil },
		"output early":   func(c *CheckpointCall) { c.Nodes[1].Kind = BodyOutput },
		"kind":           func(c *CheckpointCall) { c.Nodes[1].Kind = 9 },
		"forward read":   func(c *CheckpointCall) { c.Nodes[1].Inputs = []int32{2} },
		"self read":      func(c *CheckpointCall) { c.Nodes[1].Inputs = []int32{1} },
		"negative read":  func(c *CheckpointCall) { c.Nodes[1].Inputs = []int32{-1} },
		"block":          func(c *CheckpointCall) { c.Nodes[1].Block = -2 },
		"writes":         func(c *CheckpointCall) { c.Nodes[1].Writes = 99 },
		"pieces":         func(c *CheckpointCall) { c.Buckets = &BodyBuckets{Pieces: []int32{0}, CapBytes: 1} },
		"negative piece": func(c *CheckpointCall) { c.Buckets = &BodyBuckets{Pieces: []int32{-1, -5, 0, 0, -1}, CapBytes: 1} },
		"cap below 1":    func(c *CheckpointCall) { c.Buckets = &BodyBuckets{Pieces: []int32{-1, 0, 0, 0, -1}} },
		"negative bytes": func(c *CheckpointCall) {
			c.Buckets = &BodyBuckets{Pieces: []int32{-1, 0, 0, 0, -1}, CapBytes: 1, ParamBytes: -1}
		},
	}
	for name, corrupt := range bad {
		t.Run(name, func(t *testing.T) {
			c := good
			c.Nodes = slices.Clone(good.Nodes)
			corrupt(&c)
			_, err := SplitCheckpoints(&SplitRequest{Calls: []CheckpointCall{stackBody("ok", 0, 1, 1), c}})
			require.Error(t, err)
			assert.Contains(t, err.Error(), `checkpoint call 1 ("c")`)
		})
	}
}

// naiveRegions is the region rule written plainly (Note [Checkpoint
// regions]): region starts found first, every crossing collected, every
// blocker of the region stage listed.
func naiveRegions(c *CheckpointCall, group []int32) (region map[int]int, inputs, outputs [][]int32, blockers map[KeptWhole]bool) {
	region = map[int]int{}
	var starts []int
	last := int32(-1)
	for j, n := range c.Nodes {
		if n.Kind == BodyCompute && group[j] >= 0 {
			if group[j] != last {
				starts = append(starts, j)
			}
			last = group[j]
		}
	}
	count := max(len(starts), 1)
	for j, n := range c.Nodes {
		if n.Kind != BodyCompute {
			continue
		}
		k := 0
		for _, s := range starts[min(1, len(starts)):] {
			if s <= j {
				k++
			}
		}
		region[j] = k
	}
	for j, n := range c.Nodes {
		if n.Kind != BodyGetAttr {
			continue
		}
		k := -1
		for u, m := range c.Nodes {
			if r, ok := region[u]; ok && m.Kind == BodyCompute && slices.Contains(m.Inputs, int32(j)) && (k < 0 || r < k) {
				k = r
			}
		}
		region[j] = max(k, 0)
	}
	blockers = map[KeptWhole]bool{}
	inputs, outputs = make([][]int32, count), make([][]int32, count)
	for j := range c.Nodes {
		k, ok := region[j]
		if !ok {
			continue
		}
		for _, v := range c.Nodes[j].Inputs {
			rv, in := region[int(v)]
			if in && rv == k || slices.Contains(inputs[k], v) {
				continue
			}
			if in && rv > k {
				blockers[WholeReadEarly] = true
			}
			if c.Nodes[v].Kind == BodyGetAttr {
				blockers[WholeAttribute] = true
			}
			if c.Nodes[v].Kind != BodyPlaceholder && !c.Nodes[v].Carries {
				blockers[WholeNotCarried] = true
			}
			inputs[k] = append(inputs[k], v)
		}
		if w := c.Nodes[j].Writes; w >= 0 {
			if rw, in := region[int(w)]; !in || rw != k {
				blockers[WholeMutation] = true
			}
		}
		readLater := c.Nodes[j].Returned
		for u := range c.Nodes {
			if ru, in := region[u]; in && ru > k && slices.Contains(c.Nodes[u].Inputs, int32(j)) {
				readLater = true
			}
		}
		if readLater {
			outputs[k] = append(outputs[k], int32(j))
		}
	}
	for k := range outputs {
		if len(outputs[k]) == 0 {
			blockers[WholeNothingOn] = true
		}
	}
	return region, inputs, outputs, blockers
}

// randomCall is a body of up to ~25 nodes: placeholders, get_attrs and
// compute nodes reading earlier ones, some in place, some not carried,
// grouped in runs with gaps and returns.
func randomCall(rng *rand.Rand) CheckpointCall {
	b := &bodyBuilder{}
	for range 1 + rng.IntN(3) {
		b.placeholder()
	}
	group := int32(0)
	for range 1 + rng.IntN(22) {
		if rng.IntN(10) == 0 {
			b.attr(-1)
			continue
		}
		var in []int32
		for range 1 + rng.IntN(3) {
			in = append(in, int32(rng.IntN(len(b.nodes))))
		}
		switch rng.IntN(5) {
		case 0:
			group = int32(rng.IntN(4))
		case 1:
			group++
		}
		g := group
		if rng.IntN(4) == 0 {
			g = -1
		}
		j := b.op("op", g, in...)
		if rng.IntN(12) == 0 {
			b.nodes[j].Writes = in[0]
		}
		if rng.IntN(15) == 0 {
			b.nodes[j].Carries = false
		}
	}
	var results []int32
	for j := range b.nodes {
		if b.nodes[j].Kind == BodyCompute && rng.IntN(6) == 0 {
			results = append(results, int32(j))
		}
	}
	if len(results) == 0 {
		results = []int32{int32(len(b.nodes) - 1)}
	}
	return b.call("c", results...)
}

func checkAgainstNaive(t *testing.T, c CheckpointCall) {
	t.Helper()
	s := one(t, c)
	if s.Blocks < 2 {
		assert.Equal(t, WholeFewBlocks, s.Code)
		return
	}
	group := make([]int32, len(c.Nodes))
	for j, n := range c.Nodes {
		group[j] = n.Block
	}
	region, inputs, outputs, blockers := naiveRegions(&c, group)
	if s.Code != SplitDone {
		require.True(t, blockers[s.Code], "kept whole for %v, which the naive rule does not see: %v", s.Code, blockers)
		return
	}
	require.Empty(t, blockers, "split, but the naive rule sees blockers")
	require.Len(t, s.Regions, len(inputs))
	for j, k := range s.NodeRegion {
		if want, ok := region[j]; ok {
			require.Equal(t, int32(want), k, "node %d", j)
		} else {
			require.Equal(t, int32(-1), k, "node %d", j)
		}
	}
	for k, r := range s.Regions {
		require.Equal(t, inputs[k], append([]int32(nil), r.Inputs...), "region %d inputs", k)
		require.Equal(t, outputs[k], r.Outputs, "region %d outputs", k)
	}
}

func FuzzCheckpointRegions(f *testing.F) {
	for i := range uint64(8) {
		f.Add(i)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		checkAgainstNaive(t, randomCall(rand.New(rand.NewPCG(seed, seed>>5))))
	})
}

func TestCheckpointRegionsMatchTheNaiveReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	split := 0
	for range 3000 {
		c := randomCall(rng)
		checkAgainstNaive(t, c)
		if one(t, c).Code == SplitDone {
			split++
		}
	}
	assert.Greater(t, split, 200, "the generator must make bodies that split")
}

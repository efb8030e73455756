package planner

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Body stacks (Note [Body stacks]): the planner sees a higher-order-op
// call's stack and weight through the facts about its body.

// bodyCase is a graph's stack facts in plain form: per node its own stack,
// the call it belongs to (-1: none) and, per call, its body nodes' stacks.
type bodyCase struct {
	own    [][]stackEntry
	calls  []int32
	bodies map[int][][]stackEntry
}

// table interns c into a ModuleStacks with BodyFacts; with dup as stacksOf
// does (every string stored twice), so that the planner must compare by
// value.
func (c bodyCase) table(dup bool) *ModuleStacks {
	st := stacksOf(c.own, dup)
	index := map[string]int32{}
	for i := len(st.Strings) - 1; i >= 0; i-- {
		index[st.Strings[i]] = int32(i)
	}
	k := 0
	intern := func(s string) int32 {
		k++
		if i, ok := index[s]; ok && !(dup && k%2 == 0) {
			return i
		}
		st.Strings = append(st.Strings, s)
		index[s] = int32(len(st.Strings) - 1)
		return index[s]
	}
	b := &BodyFacts{Calls: c.calls, Offsets: []int64{0}, StackOffsets: []int64{0}}
	for i := range c.own {
		for _, stack := range c.bodies[i] {
			for _, e := range stack {
				b.Paths = append(b.Paths, intern(e.path))
				b.Types = append(b.Types, intern(e.kind))
			}
			b.StackOffsets = append(b.StackOffsets, int64(len(b.Paths)))
		}
		b.Offsets = append(b.Offsets, int64(len(b.StackOffsets)-1))
	}
	st.Bodies = b
	return st
}

// reference is the naive rule: per node the stack the block rule reads
// and its weight.
func (c bodyCase) reference() ([][]stackEntry, []int32) {
	prefix := func(call int) []stackEntry {
		var p []stackEntry
		started := false
		for _, stack := range c.bodies[call] {
			if len(stack) == 0 {
				continue
			}
			if !started {
				p, started = append([]stackEntry{}, stack...), true
				continue
			}
			n := 0
			for n < len(p) && n < len(stack) && p[n] == stack[n] {
				n++
			}
			p = p[:n]
		}
		if len(p) == 0 {
			return nil
		}
		return p
	}
	stacks := make([][]stackEntry, len(c.own))
	weights := make([]int32, len(c.own))
	for i, call := range c.calls {
		switch {
		case call < 0:
			stacks[i], weights[i] = c.own[i], 1
			if len(c.own[i]) == 0 {
				stacks[i] = nil
			}
		case int(call) == i:
			stacks[i], weights[i] = prefix(i), int32(len(c.bodies[i]))
		default:
			stacks[i], weights[i] = prefix(int(call)), 0
		}
	}
	return stacks, weights
}

// entries reads a table back into plain stacks (nil for none).
func entries(st *ModuleStacks) [][]stackEntry {
	out := make([][]stackEntry, len(st.Offsets)-1)
	for i := range out {
		for k := st.Offsets[i]; k < st.Offsets[i+1]; k++ {
			out[i] = append(out[i], stackEntry{st.Strings[st.Paths[k]], st.Strings[st.Types[k]]})
		}
	}
	return out
}

func TestThroughBodies(t *testing.T) {
	blk := func(k int, inner ...string) []stackEntry {
		s := []stackEntry{{"L['self'].blocks", "ModuleList"}, {fmt.Sprintf("L['self'].blocks.%d", k), "Block"}}
		for _, p := range inner {
			s = append(s, stackEntry{fmt.Sprintf("L['self'].blocks.%d.%s", k, p), "Linear"})
		}
		return s
	}
	head := []stackEntry{{"L['self'].head", "Linear"}}
	cases := []struct {
		name string
		c    bodyCase
		want [][]stackEntry // per node
	}{
		{"a call inside one block gets the block, its companions too",
			bodyCase{[][]stackEntry{nil, nil, nil, nil, head},
				[]int32{-1, 2, 2, 2, -1},
				map[int][][]stackEntry{2: {blk(0, "q"), blk(0, "k"), blk(0)}}},
			[][]stackEntry{nil, blk(0), blk(0), blk(0), head}},
		{"a call spanning blocks gets what they share",
			bodyCase{[][]stackEntry{nil, nil, nil},
				[]int32{0, 0, 0},
				map[int][][]stackEntry{0: {blk(0, "q"), blk(1, "q")}}},
			[][]stackEntry{blk(0)[:1], blk(0)[:1], blk(0)[:1]}},
		{"empty body stacks are skipped",
			bodyCase{[][]stackEntry{nil},
				[]int32{0},
				map[int][][]stackEntry{0: {nil, blk(3, "q"), nil, blk(3, "k")}}},
			[][]stackEntry{blk(3)}},
		{"a shorter stack cuts the prefix",
			bodyCase{[][]stackEntry{nil},
				[]int32{0},
				map[int][][]stackEntry{0: {blk(1, "q"), blk(1)[:1], blk(1, "q")}}},
			[][]stackEntry{blk(1)[:1]}},
		{"a prefix once empty stays empty",
			bodyCase{[][]stackEntry{nil},
				[]int32{0},
				map[int][][]stackEntry{0: {head, blk(0), head}}},
			[][]stackEntry{nil}},
		{"same path, other type: no common module",
			bodyCase{[][]stackEntry{nil},
				[]int32{0},
				map[int][][]stackEntry{0: {{{"m.0", "A"}}, {{"m.0", "B"}}}}},
			[][]stackEntry{nil}},
		{"an empty body: no stack, weight 0",
			bodyCase{[][]stackEntry{head, head},
				[]int32{0, 0},
				nil},
			[][]stackEntry{nil, nil}},
		{"a call's own stack is not read; other nodes keep theirs",
			bodyCase{[][]stackEntry{head, blk(2), head},
				[]int32{-1, 1, -1},
				map[int][][]stackEntry{1: {blk(5, "q")}}},
			[][]stackEntry{head, blk(5, "q"), head}},
		{"two calls, each with its companions, wherever they are",
			bodyCase{[][]stackEntry{nil, nil, nil, nil, nil, nil},
				[]int32{4, 1, 1, 4, 4, 1},
				map[int][][]stackEntry{1: {blk(0, "q"), blk(0, "k")}, 4: {blk(1, "q"), blk(1, "k")}}},
			[][]stackEntry{blk(1), blk(0), blk(0), blk(1), blk(1), blk(0)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantStacks, wantWeights := tc.c.reference()
			require.Equal(t, tc.want, wantStacks, "the reference agrees with the case")
			for _, dup := range []bool{false, true} {
				st := tc.c.table(dup)
				require.NoError(t, validateStacks(st, len(tc.c.own)))
				got := st.throughBodies()
				assert.Equal(t, tc.want, entries(got), "stacks, dup=%t", dup)
				assert.Equal(t, wantWeights, got.Weights, "weights, dup=%t", dup)
				assert.Nil(t, got.Bodies)
			}
		})
	}
	t.Run("without body facts the stacks are read as given", func(t *testing.T) {
		st := stacksOf([][]stackEntry{head}, false)
		assert.Same(t, st, st.throughBodies())
	})
}

// checkpointedBlocks is a graph of a preamble, four checkpointed blocks
// (get_attr, call, getitem each) with one parameter each, and a tail, and
// its stack facts: a call's body has five compute nodes inside its block.
func checkpointedBlocks() (*Graph, bodyCase) {
	b := &graphBuilder{}
	prev := b.placeholder("x")
	c := bodyCase{own: [][]stackEntry{nil}, calls: []int32{-1}, bodies: map[int][][]stackEntry{}}
	plain := func(name string, stack []stackEntry) {
		prev = b.call(name, in(prev))
		c.own, c.calls = append(c.own, stack), append(c.calls, -1)
	}
	plain("embed", []stackEntry{{"L['self'].embed", "Embedding"}})
	for k := range 4 {
		p := b.param(fmt.Sprintf("blocks.%d.w", k), 100)
		get := b.call(fmt.Sprintf("body_%d", k), nil)
		call := b.call(fmt.Sprintf("checkpoint_%d", k), in(get, prev), arg(p))
		prev = b.call(fmt.Sprintf("getitem_%d", k), in(call))
		c.own = append(c.own, nil, nil, nil)
		c.calls = append(c.calls, int32(call), int32(call), int32(call))
		for j := range 5 {
			c.bodies[call] = append(c.bodies[call], []stackEntry{
				{fmt.Sprintf("L['self'].blocks.%d", k), "Block"},
				{fmt.Sprintf("L['self'].blocks.%d.l%d", k, j), "Linear"},
			})
		}
	}
	plain("norm", []stackEntry{{"L['self'].norm", "LayerNorm"}})
	b.output(prev)
	c.own, c.calls = append(c.own, nil), append(c.calls, -1)
	return b.graph(), c
}

func TestDecideThroughBodies(t *testing.T) {
	g, c := checkpointedBlocks()
	set := Settings{Mode: ModeDDP, BlockCuts: true, Edges: EdgesAuto, UserBucketCapBytes: 100,
		UserFirstBucketCapBytes: 100}
	dec, err := Decide(&Request{Graph: g, Stacks: c.table(false), Settings: set})
	require.NoError(t, err)
	want := []int32{-1, -1}
	for k := range 4 {
		want = append(want, int32(k), int32(k), int32(k))
	}
	assert.Equal(t, append(want, -1, -1), dec.BlockIDs, "each call, with its get_attr and getitem, in its block")
	assert.Nil(t, dec.EagerPieces, "without costs, auto compiles the edges (Note [Edge costs])")

	// The same facts without bodies: the calls have no stack, no blocks.
	plain := stacksOf(c.own, false)
	dec2, err := Decide(&Request{Graph: g, Stacks: plain, Settings: set})
	require.NoError(t, err)
	assert.Nil(t, dec2.BlockIDs)

	// The stacks and weights the rule derives, given directly, decide alike.
	stacks, weights := c.reference()
	direct := stacksOf(stacks, false)
	direct.Weights = weights
	dec3, err := Decide(&Request{Graph: g, Stacks: direct, Settings: set})
	require.NoError(t, err)
	assert.Equal(t, dec, dec3)
}

func TestBodiesValidated(t *testing.T) {
	base := func() *ModuleStacks {
		return bodyCase{[][]stackEntry{nil, nil, nil, nil}, []int32{-1, 2, 2, -1},
			map[int][][]stackEntry{2: {{{"m.0", "A"}}, {{"m.1", "A"}}}}}.table(false)
	}
	g := blockGraph([][]stackEntry{nil, nil})
	cases := []struct {
		name   string
		change func(st *ModuleStacks)
		want   string
	}{
		{"weights too", func(st *ModuleStacks) { st.Weights = []int32{1, 1, 1, 1} }, "both node weights and body facts"},
		{"calls short", func(st *ModuleStacks) { st.Bodies.Calls = []int32{-1, 2, 2} }, "3 call entries for 4 nodes"},
		{"call out of range", func(st *ModuleStacks) { st.Bodies.Calls[0] = 4 }, "node 0 belongs to call 4, out of range [-1, 4)"},
		{"call below -1", func(st *ModuleStacks) { st.Bodies.Calls[0] = -2 }, "node 0 belongs to call -2"},
		{"belongs to no call", func(st *ModuleStacks) { st.Bodies.Calls[3] = 0 }, "node 3 belongs to node 0, which is no call"},
		{"offsets short", func(st *ModuleStacks) { st.Bodies.Offsets = st.Bodies.Offsets[:4] }, "body Offsets has 4 entries"},
		{"body on no call", func(st *ModuleStacks) { st.Bodies.Calls = []int32{-1, 1, 1, -1} }, "node 2 has 2 body nodes but is no call"},
		{"stack offsets empty", func(st *ModuleStacks) { st.Bodies.StackOffsets = nil }, "StackOffsets is empty"},
		{"stack offsets start", func(st *ModuleStacks) { st.Bodies.StackOffsets[0] = 1 }, "StackOffsets[0] is 1"},
		{"stack offsets decrease", func(st *ModuleStacks) { st.Bodies.StackOffsets[1] = 3 }, "StackOffsets decreases at body node 1"},
		{"types short", func(st *ModuleStacks) { st.Bodies.Types = st.Bodies.Types[:1] }, "2 paths and 1 types"},
		{"string out of range", func(st *ModuleStacks) { st.Bodies.Types[1] = 9 }, "body stack entry 1: type string 9 out of range [0, 3)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := base()
			require.NoError(t, validateStacks(st, 4))
			tc.change(st)
			_, err := Decide(&Request{Graph: g, Stacks: st, Settings: Settings{BlockCuts: true}})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			var perr *Error
			require.True(t, errors.As(err, &perr), "%v", err)
			assert.Equal(t, ErrInvalidGraph, perr.Code)
		})
	}
}

// randomBodies draws, for a graph of n nodes, calls with bodies of up to
// six stacks and companions for some of the other nodes.
func randomBodies(s *byteSource, own [][]stackEntry) bodyCase {
	n := len(own)
	c := bodyCase{own: own, calls: make([]int32, n), bodies: map[int][][]stackEntry{}}
	var calls []int32
	for i := range n {
		c.calls[i] = -1
		if s.chance(60) {
			c.calls[i] = int32(i)
			calls = append(calls, int32(i))
			c.bodies[i] = randomStacks(s, &Graph{Ops: make([]OpKind, s.intn(7))})
		}
	}
	for i := range n {
		if c.calls[i] < 0 && len(calls) > 0 && s.chance(80) {
			c.calls[i] = calls[s.intn(len(calls))]
		}
	}
	return c
}

// checkBodies compares the body rule with the reference on one input, and
// Decide on the facts with Decide on the reference's stacks and weights.
func checkBodies(t *testing.T, data []byte) {
	g, cfg := decodeFuzzInput(data)
	g.BlockIDs = nil
	if validateGraph(g) != nil || len(g.Ops) == 0 {
		return
	}
	s := &byteSource{data: data, pos: len(data) / 2}
	c := randomBodies(s, randomStacks(s, g))
	st := c.table(s.chance(128))
	require.NoError(t, validateStacks(st, len(g.Ops)))
	wantStacks, wantWeights := c.reference()
	got := st.throughBodies()
	require.Equal(t, wantStacks, entries(got), "stacks")
	require.Equal(t, wantWeights, got.Weights, "weights")

	if cfg.Mode != ModeDDP || validateConfig(&cfg) != nil {
		return
	}
	set := settingsFor(cfg, true)
	set.Edges = EdgePolicy(s.intn(3))
	dec, derr := Decide(&Request{Graph: g, Stacks: st, Settings: set})
	direct := stacksOf(wantStacks, false)
	direct.Weights = wantWeights
	ref, rerr := Decide(&Request{Graph: g, Stacks: direct, Settings: set})
	require.Equal(t, rerr, derr)
	require.Equal(t, ref, dec)
}

func TestRandomBodies(t *testing.T) {
	forRandomFuzzInputs(t, rand.New(rand.NewPCG(2718, 28)), 3000, 400, func(data []byte) {
		checkBodies(t, data)
	})
}

func FuzzBodies(f *testing.F) {
	f.Add([]byte{0x00, 8, 100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	addRandomSeeds(f, rand.New(rand.NewPCG(5, 6)))
	f.Fuzz(checkBodies)
}

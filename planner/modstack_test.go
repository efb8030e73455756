package planner

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stackEntry is one module of a node's stack: its path and its type.
type stackEntry struct{ path, kind string }

// stacksOf interns per-node stacks into a ModuleStacks table. With dup,
// every string is stored twice and entries alternate between the copies,
// so that the planner must intern by value.
func stacksOf(stacks [][]stackEntry, dup bool) *ModuleStacks {
	st := &ModuleStacks{Offsets: []int64{0}}
	index := map[string]int32{}
	intern := func(s string, k int) int32 {
		key := s
		if dup && k%2 == 1 {
			key = s + "\x00copy"
		}
		i, ok := index[key]
		if !ok {
			i = int32(len(st.Strings))
			index[key] = i
			st.Strings = append(st.Strings, s)
		}
		return i
	}
	k := 0
	for _, stack := range stacks {
		for _, e := range stack {
			st.Paths = append(st.Paths, intern(e.path, k))
			st.Types = append(st.Types, intern(e.kind, k))
			k++
		}
		st.Offsets = append(st.Offsets, int64(len(st.Paths)))
	}
	return st
}

func TestIndexedParent(t *testing.T) {
	cases := []struct {
		path, parent string
		ok           bool
	}{
		{"L['self'].blocks.3", "L['self'].blocks", true},
		{"L['self'].blocks[3]", "L['self'].blocks", true},
		{"blocks.12", "blocks", true},
		{"a.1.2", "a.1", true},
		{"a.[3]", "a.", true},
		{"blocks.03", "blocks", true},
		{"blocks.٣", "blocks", true}, // a Unicode decimal digit, as Python's \d
		{".3", "", false},            // no parent
		{"[3]", "", false},
		{"blocks", "", false},
		{"blocks.", "", false},
		{"blocks[]", "", false},
		{"x[3", "", false},
		{"x3]", "", false},
		{"a.b3", "", false},
		{"", "", false},
	}
	for _, tc := range cases {
		parent, ok := indexedParent(tc.path)
		assert.Equal(t, tc.ok, ok, "%q", tc.path)
		assert.Equal(t, tc.parent, parent, "%q", tc.path)
	}
}

// blockGraph is a chain of compute nodes between a placeholder and the
// output, one per stack (the placeholder's and output's stacks are given
// too, and must be ignored).
func blockGraph(stacks [][]stackEntry) *Graph {
	b := &graphBuilder{}
	prev := b.placeholder("x")
	for i := range stacks {
		prev = b.call(fmt.Sprintf("n%d", i), in(prev))
	}
	b.output(prev)
	return b.graph()
}

func TestAssignBlocks(t *testing.T) {
	layer := func(k int) []stackEntry {
		return []stackEntry{{fmt.Sprintf("L['self'].blocks.%d", k), "Block"}}
	}
	nested := func(k, j int) []stackEntry {
		return []stackEntry{
			{fmt.Sprintf("L['self'].body[%d]", k), "Layer"},
			{fmt.Sprintf("L['self'].body[%d].ff.%d", k, j), "FF"},
		}
	}
	head := []stackEntry{{"L['self'].head", "Linear"}}
	cases := []struct {
		name   string
		stacks [][]stackEntry
		want   []int32 // per compute node; nil: no blocks at all
	}{
		{"two layers of two nodes", [][]stackEntry{nil, layer(0), layer(0), layer(1), layer(1), head},
			[]int32{-1, 0, 0, 1, 1, -1}},
		{"numbered by first appearance", [][]stackEntry{layer(5), layer(5), layer(2), layer(2)},
			[]int32{0, 0, 1, 1}},
		{"single-node layers are no blocks", [][]stackEntry{layer(0), layer(1), layer(2)}, nil},
		{"mean of two nodes suffices", [][]stackEntry{layer(0), layer(0), layer(0), layer(1)},
			[]int32{0, 0, 0, 1}},
		{"one instance is no block", [][]stackEntry{layer(0), layer(0), layer(0)}, nil},
		{"the outermost repeated level wins", [][]stackEntry{nested(0, 0), nested(0, 1), nested(1, 0), nested(1, 1)},
			[]int32{0, 0, 1, 1}},
		{"siblings of another type are another key", [][]stackEntry{
			{{"L['self'].blocks.0", "Block"}}, {{"L['self'].blocks.0", "Block"}},
			{{"L['self'].blocks.1", "Other"}}, {{"L['self'].blocks.1", "Other"}}}, nil},
		{"no stacks", [][]stackEntry{nil, nil}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, dup := range []bool{false, true} {
				g := blockGraph(tc.stacks)
				// The placeholder's and the output's own stacks say "block".
				all := append(append([][]stackEntry{layer(9)}, tc.stacks...), layer(9))
				st := stacksOf(all, dup)
				require.NoError(t, validateStacks(st, len(g.Ops)))
				got := assignBlocks(g, st)
				if tc.want == nil {
					assert.Nil(t, got, "dup=%t", dup)
					continue
				}
				want := append(append([]int32{-1}, tc.want...), -1)
				assert.Equal(t, want, got, "dup=%t", dup)
				assert.Equal(t, want, referenceBlocks(g, all), "the reference disagrees with the case")
			}
		})
	}
}

func TestStacksValidated(t *testing.T) {
	g := blockGraph([][]stackEntry{nil, nil})
	good := func() *ModuleStacks {
		return stacksOf([][]stackEntry{nil, {{"a.0", "A"}}, {{"a.1", "A"}}, nil}, false)
	}
	cases := []struct {
		name   string
		break_ func(st *ModuleStacks)
		want   string
	}{
		{"short offsets", func(st *ModuleStacks) { st.Offsets = st.Offsets[1:] }, "module stack Offsets has 4 entries"},
		{"decreasing offsets", func(st *ModuleStacks) { st.Offsets[3] = 0 }, "module stack Offsets decreases"},
		{"types missing", func(st *ModuleStacks) { st.Types = st.Types[:1] }, "1 types for 2 paths"},
		{"path out of range", func(st *ModuleStacks) { st.Paths[1] = 7 }, "path string 7 out of range"},
		{"type below zero", func(st *ModuleStacks) { st.Types[0] = -1 }, "type string -1 out of range"},
	}
	for _, tc := range cases {
		st := good()
		tc.break_(st)
		_, err := Decide(&Request{Graph: g, Stacks: st, Settings: Settings{BlockCuts: true}})
		var perr *Error
		require.ErrorAs(t, err, &perr, tc.name)
		assert.Equal(t, ErrInvalidGraph, perr.Code, tc.name)
		assert.Contains(t, perr.Msg, tc.want, tc.name)
	}
}

// referenceIndexed is the block rule's path pattern written as Python's
// regular expression was (\d: a Unicode decimal digit).
var referenceIndexed = regexp.MustCompile(`^(.+?)(?:\.\p{Nd}+|\[\p{Nd}+\])$`)

// referenceBlocks is a naive reading of Note [Block rule] over the stacks
// as strings: no interning, one map per question.
func referenceBlocks(g *Graph, stacks [][]stackEntry) []int32 {
	type key struct{ parent, kind string }
	counts := map[key]map[string]int{}
	for i, stack := range stacks {
		if !isCompute(g.Ops[i]) {
			continue
		}
		for _, e := range stack {
			if m := referenceIndexed.FindStringSubmatch(e.path); m != nil {
				k := key{m[1], e.kind}
				if counts[k] == nil {
					counts[k] = map[string]int{}
				}
				counts[k][e.path]++
			}
		}
	}
	numbers := map[string]int32{}
	ids := make([]int32, len(g.Ops))
	found := false
	for i, stack := range stacks {
		ids[i] = -1
		if !isCompute(g.Ops[i]) {
			continue
		}
		for _, e := range stack {
			m := referenceIndexed.FindStringSubmatch(e.path)
			if m == nil {
				continue
			}
			c := counts[key{m[1], e.kind}]
			total := 0
			for _, n := range c {
				total += n
			}
			if len(c) < 2 || total < minBlockNodes*len(c) {
				continue
			}
			if _, ok := numbers[e.path]; !ok {
				numbers[e.path] = int32(len(numbers))
			}
			ids[i], found = numbers[e.path], true
			break
		}
	}
	if !found {
		return nil
	}
	return ids
}

// randomStacks draws module stacks from a small vocabulary of paths, with
// indexed and plain modules, odd spellings and two types, for every node of
// g (placeholders and the output included).
func randomStacks(s *byteSource, g *Graph) [][]stackEntry {
	parents := []string{"L['self'].blocks", "L['self'].body", "L['self'].body.0.ff", "m"}
	plain := []string{"L['self'].head", "L['self'].blocks", ".3", "x[3", "blocks.", "a.b1"}
	digits := []string{"0", "1", "2", "3", "٣"}
	kinds := []string{"Block", "Linear"}
	stacks := make([][]stackEntry, len(g.Ops))
	for i := range stacks {
		for range s.intn(4) {
			kind := kinds[s.intn(len(kinds))]
			if s.chance(60) {
				stacks[i] = append(stacks[i], stackEntry{plain[s.intn(len(plain))], kind})
				continue
			}
			parent, d := parents[s.intn(len(parents))], digits[s.intn(len(digits))]
			path := parent + "." + d
			if s.chance(80) {
				path = parent + "[" + d + "]"
			}
			stacks[i] = append(stacks[i], stackEntry{path, kind})
		}
	}
	return stacks
}

// checkBlockRule compares assignBlocks with the reference on one input, and
// Decide's block cuts with Build's on the reference's block ids.
func checkBlockRule(t *testing.T, data []byte) {
	g, cfg := decodeFuzzInput(data)
	g.BlockIDs = nil
	if validateGraph(g) != nil || len(g.Ops) == 0 {
		return
	}
	s := &byteSource{data: data, pos: len(data) / 2}
	stacks := randomStacks(s, g)
	st := stacksOf(stacks, s.chance(128))
	want := referenceBlocks(g, stacks)
	require.Equal(t, want, assignBlocks(g, st), "block ids")

	if cfg.Mode != ModeDDP || validateConfig(&cfg) != nil {
		return
	}
	dec, derr := Decide(&Request{Graph: g, Stacks: st, Settings: settingsFor(cfg, true)})
	ref := *g
	ref.BlockIDs = want
	pl, berr := Build(&ref, cfg)
	if berr != nil {
		require.Error(t, derr, "Build refused (%v) but Decide did not", berr)
		return
	}
	require.NoError(t, derr)
	require.Equal(t, pl.Fingerprint, dec.Plan.Fingerprint)
	require.Equal(t, want, dec.BlockIDs)
}

func TestRandomBlockRule(t *testing.T) {
	forRandomFuzzInputs(t, rand.New(rand.NewPCG(31337, 15)), 3000, 400, func(data []byte) {
		checkBlockRule(t, data)
	})
}

func FuzzBlockRule(f *testing.F) {
	f.Add([]byte{0x00, 8, 100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte{0x02, 8, 200, 100, 50, 30, 255, 7, 3, 39, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 1, 1, 1, 1, 1})
	f.Fuzz(checkBlockRule)
}

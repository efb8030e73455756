package planner

// This file sees the module stacks and node weights through the bodies of
// higher-order-op calls (activation checkpoints), from facts the caller
// gathers (BodyFacts).
//
// Note [Body stacks]: Dynamo captures an activation checkpoint as one call
// of a higher-order op whose body is a subgraph of its own, a get_attr of
// the body before it and a getitem per result after it (python/goddp/
// graph/checkpoints.py, Note [Checkpoint bodies]). The call has no module
// stack of its own; its body's nodes have the full one. The caller hands
// over, per call, the module stacks of its body's compute nodes, flattened
// through nested calls (a nested call stands for its own body's nodes), and
// which outer nodes are a call's companions (its body's get_attr, its
// getitems). The planner then reads, for the block rule (Note [Block rule])
// and the edges (Note [Edges]):
//   - as a call's stack, the modules its whole body runs inside: the common
//     prefix of its body's non-empty stacks, entries compared by value (none
//     for a body without any). A call inside one block lands in it, one whose
//     body spans several blocks in none;
//   - as a companion's stack, its call's, so that it goes where the call goes;
//   - as weights (Note [Node weights]), a call its body's compute nodes, a
//     companion 0, any other node 1.

// BodyFacts are the facts about higher-order-op calls that a graph's
// module stacks are seen through (Note [Body stacks]). Body stack entries
// name strings of the ModuleStacks that holds them.
type BodyFacts struct {
	// Calls is per node the call it belongs to: a call its own index, its
	// body's get_attr and its getitems the call's index, any other node -1.
	Calls []int32
	// Offsets (len(Graph.Ops) + 1): entries Offsets[i]:Offsets[i+1] are
	// the body nodes of call i, its body's compute nodes flattened, in
	// order; empty for any node but a call.
	Offsets []int64
	// StackOffsets (Offsets[n] + 1): entries StackOffsets[k]:StackOffsets[k+1]
	// of Paths and Types are body node k's module stack, outermost first.
	StackOffsets []int64
	Paths        []int32 // per entry: index into ModuleStacks.Strings of the module path
	Types        []int32 // per entry: index into ModuleStacks.Strings of the module type
}

// throughBodies returns the stacks the block rule and the edges read: st
// itself without body facts, else a table of each node's effective stack
// and weight under Note [Body stacks] (st must be valid).
func (st *ModuleStacks) throughBodies() *ModuleStacks {
	if st == nil || st.Bodies == nil {
		return st
	}
	b := st.Bodies
	n := len(b.Calls)
	out := &ModuleStacks{Strings: st.Strings, Offsets: make([]int64, 1, n+1), Weights: make([]int32, n)}
	prefixes := make(map[int32][2]int64) // per call: its prefix's first body entry and length
	for i := range n {
		if b.Calls[i] == int32(i) {
			prefixes[int32(i)] = b.commonPrefix(st.Strings, i)
		}
	}
	for i := range n {
		c := b.Calls[i]
		switch {
		case c < 0:
			out.Weights[i] = 1
			out.Paths = append(out.Paths, st.Paths[st.Offsets[i]:st.Offsets[i+1]]...)
			out.Types = append(out.Types, st.Types[st.Offsets[i]:st.Offsets[i+1]]...)
		default:
			if c == int32(i) {
				out.Weights[i] = int32(b.Offsets[i+1] - b.Offsets[i])
			}
			p := prefixes[c]
			out.Paths = append(out.Paths, b.Paths[p[0]:p[0]+p[1]]...)
			out.Types = append(out.Types, b.Types[p[0]:p[0]+p[1]]...)
		}
		out.Offsets = append(out.Offsets, int64(len(out.Paths)))
	}
	return out
}

// commonPrefix returns the common prefix of call c's body stacks that are
// not empty, as its first entry in Paths/Types and its length.
func (b *BodyFacts) commonPrefix(strs []string, c int) [2]int64 {
	from, size := int64(0), int64(-1)
	for k := b.Offsets[c]; k < b.Offsets[c+1]; k++ {
		lo, hi := b.StackOffsets[k], b.StackOffsets[k+1]
		if lo == hi {
			continue
		}
		if size < 0 {
			from, size = lo, hi-lo
			continue
		}
		keep := int64(0)
		for keep < size && lo+keep < hi && b.sameEntry(strs, from+keep, lo+keep) {
			keep++
		}
		size = keep
	}
	return [2]int64{from, max(size, 0)}
}

// sameEntry says whether body entries j and k name the same module, by
// value (a caller's duplicate strings are the same module).
func (b *BodyFacts) sameEntry(strs []string, j, k int64) bool {
	return strs[b.Paths[j]] == strs[b.Paths[k]] && strs[b.Types[j]] == strs[b.Types[k]]
}

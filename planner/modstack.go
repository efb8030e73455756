package planner

import "unicode"

// This file assigns nodes to repeated module blocks (Graph.BlockIDs) from
// the module stack of each node, the facts Dynamo records in
// node.meta["nn_module_stack"]: for every module the node runs inside,
// outermost first, its path ("L['self'].blocks.3") and its type.
//
// Note [Block rule]: a repeated block is a module reached by index from a
// container (a path ending in ".3" or "[3]") whose siblings of the same
// type (same parent path, same type) also appear in the graph: at least
// two instances, spanning at least minBlockNodes compute nodes each on
// average (a repeated nn.Linear is a layer, not a block, and a piece per
// Linear would only add per-piece overhead). A compute node belongs to the
// outermost such module on its stack; blocks are numbered by path in order
// of first appearance. Placeholders and the output belong to none. Only
// graph facts are read, so every rank numbers alike.

// minBlockNodes is the least mean number of compute nodes per instance of
// a repeated block.
const minBlockNodes = 2

// ModuleStacks is, per node, its module stack in interned form: entries
// Offsets[i]:Offsets[i+1] are node i's, outermost first, each naming its
// module's path and type by index into Strings.
type ModuleStacks struct {
	Strings []string
	Offsets []int64 // len(Graph.Ops) + 1
	Paths   []int32 // per entry: index into Strings of the module path
	Types   []int32 // per entry: index into Strings of the module type
	// Weights, optional (nil: one each), is per node how many compute
	// nodes it stands for (Note [Node weights]).
	Weights []int32
	// Bodies, optional (nil: none), are the facts about higher-order-op
	// calls from which the planner derives the stacks and weights it
	// reads (Note [Body stacks]); not with Weights.
	Bodies *BodyFacts
}

// Note [Node weights]: a node may stand for several compute nodes of the
// model. Dynamo captures an activation checkpoint as one call of a
// higher-order op whose body is a subgraph of its own, plus a get_attr of
// the body and a getitem per result; the call weighs its body's compute
// nodes, and the get_attr and getitems 0, as the planner derives from the
// body facts (Note [Body stacks]) or a C caller gives directly. The block
// rule's instance sizes (minBlockNodes) then count what the model runs, so
// that a checkpointed block weighs what the same block does
// uncheckpointed (its costs, Note [Edge costs], are its body's too).

// weight returns node i's weight under st (one each without weights).
func (st *ModuleStacks) weight(i int) int {
	if st == nil || st.Weights == nil {
		return 1
	}
	return int(st.Weights[i])
}

// validateStacks checks the table's shape against a graph of n nodes.
func validateStacks(st *ModuleStacks, n int) error {
	if err := checkCSR("module stack Offsets", "Paths", st.Offsets, n, len(st.Paths)); err != nil {
		return err
	}
	if st.Weights != nil {
		if len(st.Weights) != n {
			return errorf(ErrInvalidGraph, "planner: module stacks: %d node weights for %d nodes", len(st.Weights), n)
		}
		for i, w := range st.Weights {
			if w < 0 {
				return errorf(ErrInvalidGraph, "planner: node %d has weight %d; weights are at least 0", i, w)
			}
		}
	}
	if st.Bodies != nil {
		if st.Weights != nil {
			return errorf(ErrInvalidGraph, "planner: module stacks: both node weights and body facts given; give the body facts and let the planner weigh the nodes (Note [Body stacks])")
		}
		if err := validateBodies(st.Bodies, n, len(st.Strings)); err != nil {
			return err
		}
	}
	if len(st.Types) != len(st.Paths) {
		return errorf(ErrInvalidGraph, "planner: module stacks: %d types for %d paths; want one type per entry",
			len(st.Types), len(st.Paths))
	}
	for k := range st.Paths {
		for _, ref := range [2]struct {
			what string
			idx  int32
		}{{"path", st.Paths[k]}, {"type", st.Types[k]}} {
			if ref.idx < 0 || int(ref.idx) >= len(st.Strings) {
				return errorf(ErrInvalidGraph, "planner: module stack entry %d: %s string %d out of range [0, %d)",
					k, ref.what, ref.idx, len(st.Strings))
			}
		}
	}
	return nil
}

// indexedParent returns the parent path of a path that ends in an index,
// ".<digits>" or "[<digits>]" after a non-empty parent, and whether it
// does. Digits are Unicode decimal digits.
func indexedParent(path string) (string, bool) {
	r := []rune(path)
	end := len(r)
	if end > 0 && r[end-1] == ']' {
		end--
	}
	start := end
	for start > 0 && unicode.IsDigit(r[start-1]) {
		start--
	}
	if start == end || start < 2 {
		return "", false
	}
	if end < len(r) {
		if r[start-1] != '[' {
			return "", false
		}
	} else if r[start-1] != '.' {
		return "", false
	}
	return string(r[:start-1]), true
}

// blockAssigner holds the state of one block assignment: each entry's
// sibling key (parent path and type) interned, and per key the nodes of each
// of its instances.
type blockAssigner struct {
	g       *Graph
	st      *ModuleStacks
	keyOf   []int32 // per entry: its sibling key, -1 for a path without index
	pathOf  []int32 // per entry: its path, interned by value
	members []map[int32]int
}

// assignBlocks returns Graph.BlockIDs for g under Note [Block rule], or nil
// when no node belongs to a repeated block.
func assignBlocks(g *Graph, st *ModuleStacks) []int32 {
	a := &blockAssigner{g: g, st: st}
	a.internEntries()
	a.countInstances()
	return a.number(a.repeatedKeys())
}

// internEntries gives every entry of a compute node its sibling key and
// path number, interning by string value so that a caller's duplicate
// strings do not split a key.
func (a *blockAssigner) internEntries() {
	st := a.st
	keys := map[[2]string]int32{}
	paths := map[string]int32{}
	a.keyOf = make([]int32, len(st.Paths))
	a.pathOf = make([]int32, len(st.Paths))
	for i, op := range a.g.Ops {
		for k := st.Offsets[i]; k < st.Offsets[i+1]; k++ {
			a.keyOf[k] = -1
			if !isCompute(op) {
				continue
			}
			path := st.Strings[st.Paths[k]]
			parent, ok := indexedParent(path)
			if !ok {
				continue
			}
			sib := [2]string{parent, st.Strings[st.Types[k]]}
			key, seen := keys[sib]
			if !seen {
				key = int32(len(keys))
				keys[sib] = key
			}
			p, seen := paths[path]
			if !seen {
				p = int32(len(paths))
				paths[path] = p
			}
			a.keyOf[k], a.pathOf[k] = key, p
		}
	}
	a.members = make([]map[int32]int, len(keys))
}

// countInstances counts, per sibling key, the compute nodes of each
// instance: each node's entries count its weight (Note [Node weights]).
func (a *blockAssigner) countInstances() {
	st := a.st
	for i := range a.g.Ops {
		w := st.weight(i)
		for k := st.Offsets[i]; k < st.Offsets[i+1]; k++ {
			key := a.keyOf[k]
			if key < 0 {
				continue
			}
			if a.members[key] == nil {
				a.members[key] = map[int32]int{}
			}
			a.members[key][a.pathOf[k]] += w
		}
	}
}

// repeatedKeys marks the sibling keys with at least two instances of at
// least minBlockNodes entries each on average.
func (a *blockAssigner) repeatedKeys() []bool {
	repeated := make([]bool, len(a.members))
	for key, counts := range a.members {
		total := 0
		for _, c := range counts {
			total += c
		}
		repeated[key] = len(counts) >= 2 && total >= minBlockNodes*len(counts)
	}
	return repeated
}

// number gives each compute node the block of the outermost repeated entry
// on its stack, numbering blocks by path in order of first appearance.
func (a *blockAssigner) number(repeated []bool) []int32 {
	st := a.st
	ids := make([]int32, len(a.g.Ops))
	numbers := map[int32]int32{}
	found := false
	for i := range ids {
		ids[i] = -1
		for k := st.Offsets[i]; k < st.Offsets[i+1]; k++ {
			key := a.keyOf[k]
			if key < 0 || !repeated[key] {
				continue
			}
			n, seen := numbers[a.pathOf[k]]
			if !seen {
				n = int32(len(numbers))
				numbers[a.pathOf[k]] = n
			}
			ids[i], found = n, true
			break
		}
	}
	if !found {
		return nil
	}
	return ids
}

package planner

import "strconv"

// Note [Checkpoint regions]
//
// The caller rewrites an activation checkpoint whose body holds several
// blocks, or more than a bucket's parameters, into consecutive checkpoints,
// one per region of its body (python/goddp/graph/checkpoints.py, Note
// [Checkpoint bodies], says why and what it costs). SplitCheckpoints makes
// every decision of that rewrite from facts about each body node; the
// caller reads the facts from torch and does the FX rewrite.
//
// Regions. A region starts at the first node of every run of one group (a
// block, or a piece of the body's own bucket plan, Note [Uniform caps]);
// nodes of no group (-1) join the run before them, and those before the
// first group the first run, as block runs group pieces (blocks.go). A
// get_attr goes to the region of its first user (the first region when it
// has none). A region's inputs are the values it reads from outside it, in
// the order its nodes read them; its outputs its nodes that the body
// returns or a later region reads, in graph order.
//
// Kept whole. A call stays one checkpoint, with the first reason below that
// holds: its body holds fewer than two blocks and is not split at buckets;
// its result is used other than by indexing; its selective policy is a
// function (it may keep state across the checkpoint's ops; a list of ops to
// save carries over to each region unchanged); a node is a random op (its
// saved RNG state would move), changes grad mode or autocast (state would
// cross the cut) or is a nested higher-order op; then, region by region,
// node by node, a value read before the region that makes it, a body
// attribute read on both sides of a cut, a value that cannot cross a cut
// (not a tensor, symbolic or Python number), an in-place write to a value
// from before the region, a region whose values nobody reads.
//
// The same blockers hold for either split.
//
// Combination, per graph. Block splits come first. Only where no call is
// split at blocks, the caller can plan bodies by buckets, and the planner,
// planning the outer graph, does not cut it at block runs (Plan.BlockRuns,
// asked of the caller only then), are the calls whose bodies hold fewer
// than two blocks planned by buckets (asked of the caller for exactly
// those) and decided again at their pieces, where that plan says so
// (Decision.CheckpointRegions). A graph cut at block runs is not split at
// buckets: its pieces begin only at block runs (blocks.go), so regions
// inside a block or the tail would land in one piece and only cost memory;
// a block over a bucket is one piece there, checkpointed or not.
//
// Said. A call with fewer than two blocks that is not tried at buckets
// (not planned, no DDP parameter, or its plan makes one piece) has nothing
// to split and nothing to say (SplitReply.Said leaves it out); every other
// call gets one INFO line, which the caller words from the decision (the
// boundaries tried, the code and the node or region it names) and, for
// buckets, from its own plan's parameter bytes against the cap.

// BodyNodeKind is what a checkpoint body node is, as its FX op says.
type BodyNodeKind uint8

const (
	BodyPlaceholder BodyNodeKind = iota
	BodyGetAttr
	BodyCompute // call_function, call_method, call_module
	BodyOutput
)

// BodyNode is one node of a checkpoint body, in graph order.
type BodyNode struct {
	Kind BodyNodeKind
	// Block is the node's block instance (-1: none).
	Block int32
	// Inputs are the nodes it reads (FX's all_input_nodes, in that order).
	Inputs []int32
	// Returned: the body's output returns it.
	Returned bool
	// Writes is the node it writes in place (-1: none).
	Writes int32
	// Carries: its value may cross a cut (a tensor, a symbolic or Python
	// number).
	Carries bool
	// What the caller reads from torch: a random op, a grad-mode or
	// autocast change, a nested higher-order op.
	Random, StateChange, Nested bool
}

// BodyBuckets is a checkpoint body planned alone by buckets (Note [Uniform
// caps]).
type BodyBuckets struct {
	Pieces     []int32 // per body node its piece (-1: none)
	ParamBytes int64   // the DDP parameters' bytes it holds
	CapBytes   int64   // the bucket cap every bucket was planned under
	Buckets    int     // the buckets they fill
	Regions    bool    // Decision.CheckpointRegions
}

// CheckpointCall is one checkpoint call of a graph, with its body.
type CheckpointCall struct {
	Name           string // the call node's name
	Nodes          []BodyNode
	IndexedOnly    bool // every use of its result is an indexing
	PolicyFunction bool // a selective policy other than a list of ops to save
	// Buckets is the caller's answer to AskBuckets for this call; nil: not
	// asked, or the body holds no DDP parameter.
	Buckets *BodyBuckets
}

// SplitRequest is every checkpoint call of one graph, and the caller's
// answers so far (Note [Checkpoint regions], "Combination").
type SplitRequest struct {
	Calls []CheckpointCall
	// BucketSplits: the caller can plan bodies by buckets.
	BucketSplits bool
	// CutAtBlocks answers AskCutAtBlocks: Plan.BlockRuns of the outer graph.
	CutAtBlocks *bool
	// BucketsPlanned: the calls AskBuckets named carry their Buckets.
	BucketsPlanned bool
}

// SplitQuestion is what SplitCheckpoints needs to know before it decides.
type SplitQuestion uint8

const (
	AskNothing     SplitQuestion = iota // the reply is the decision
	AskCutAtBlocks                      // set SplitRequest.CutAtBlocks, ask again
	AskBuckets                          // plan SplitReply.PlanBuckets' bodies, ask again
)

func (q SplitQuestion) String() string {
	switch q {
	case AskCutAtBlocks:
		return "cut_at_blocks"
	case AskBuckets:
		return "buckets"
	}
	return ""
}

// KeptWhole says why a checkpoint call stays one checkpoint.
type KeptWhole uint8

const (
	SplitDone KeptWhole = iota // it is split
	WholeFewBlocks
	WholeResultUsed
	WholePolicy
	WholeRandom
	WholeStateChange
	WholeNested
	WholeReadEarly
	WholeAttribute
	WholeNotCarried
	WholeMutation
	WholeNothingOn
)

var keptWholeNames = [...]string{
	"", "few_blocks", "result_used", "policy_function", "random_op", "state_change", "nested_hop",
	"read_before_made", "attribute_both_sides", "not_carried", "mutation_across_cut", "hands_nothing_on",
}

func (k KeptWhole) String() string {
	if int(k) < len(keptWholeNames) {
		return keptWholeNames[k]
	}
	return "KeptWhole(" + strconv.Itoa(int(k)) + ")"
}

// CheckpointRegion is one region's crossings: body node indices.
type CheckpointRegion struct {
	Inputs  []int32 // the values it reads from before it
	Outputs []int32 // its values read after it
}

// CheckpointSplit is what is done with one call.
type CheckpointSplit struct {
	// Boundary says which cuts were tried: "block", "bucket", or "" (none:
	// nothing to split, nothing to say).
	Boundary string
	Blocks   int // block instances its body holds
	// NodeRegion is, per body node, its region (-1: placeholders, the
	// output); nil when the call is kept whole.
	NodeRegion []int32
	Regions    []CheckpointRegion
	// Code says why the call stays whole; Node is the body node that
	// reason names (WholeRandom: the op, WholeNotCarried: the value,
	// WholeMutation: the writer) and Region the region (WholeNothingOn),
	// each -1 otherwise.
	Code   KeptWhole
	Node   int32
	Region int
}

// SplitReply is a question, or the decision: per call what is done with
// it, and the calls with something to say (Note [Checkpoint regions]), in
// call order, which the caller logs and rewrites.
type SplitReply struct {
	Ask         SplitQuestion
	PlanBuckets []int // with AskBuckets: the calls to plan by buckets
	Calls       []CheckpointSplit
	Said        []int
}

// SplitCheckpoints applies Note [Checkpoint regions] to one graph's calls.
func SplitCheckpoints(req *SplitRequest) (*SplitReply, error) {
	for i := range req.Calls {
		if err := validateCall(i, &req.Calls[i]); err != nil {
			return nil, err
		}
	}
	splits := make([]CheckpointSplit, len(req.Calls))
	anySplit := false
	for i := range req.Calls {
		splits[i] = splitCall(&req.Calls[i], false)
		anySplit = anySplit || splits[i].NodeRegion != nil
	}
	var few []int
	for i, s := range splits {
		if s.Blocks < 2 {
			few = append(few, i)
		}
	}
	if req.BucketSplits && !anySplit && len(few) > 0 {
		switch {
		case req.CutAtBlocks == nil:
			return &SplitReply{Ask: AskCutAtBlocks}, nil
		case *req.CutAtBlocks:
		case !req.BucketsPlanned:
			return &SplitReply{Ask: AskBuckets, PlanBuckets: few}, nil
		default:
			for _, i := range few {
				splits[i] = splitCall(&req.Calls[i], true)
			}
		}
	}
	reply := &SplitReply{Calls: splits, Said: []int{}}
	for i, s := range splits {
		if s.Boundary != "" {
			reply.Said = append(reply.Said, i)
		}
	}
	return reply, nil
}

func validateCall(i int, c *CheckpointCall) error {
	n := len(c.Nodes)
	if n == 0 || c.Nodes[n-1].Kind != BodyOutput {
		return errorf(ErrInvalidGraph, "planner: checkpoint call %d (%q): its body must end with its output node", i, c.Name)
	}
	if n > 1<<30 {
		return errorf(ErrInvalidGraph, "planner: checkpoint call %d (%q): %d body nodes is too many", i, c.Name, n)
	}
	for j, node := range c.Nodes {
		if node.Kind > BodyOutput {
			return errorf(ErrInvalidGraph, "planner: checkpoint call %d (%q): node %d: kind %d out of range [0, 3]", i, c.Name, j, node.Kind)
		}
		if node.Kind == BodyOutput && j != n-1 {
			return errorf(ErrInvalidGraph, "planner: checkpoint call %d (%q): node %d is an output node before the last", i, c.Name, j)
		}
		if node.Block < -1 {
			return errorf(ErrInvalidGraph, "planner: checkpoint call %d (%q): node %d: block %d (use -1 for none)", i, c.Name, j, node.Block)
		}
		for _, v := range node.Inputs {
			if v < 0 || int(v) >= j {
				return errorf(ErrInvalidGraph, "planner: checkpoint call %d (%q): node %d reads node %d, which does not come before it", i, c.Name, j, v)
			}
		}
		if node.Writes < -1 || int(node.Writes) >= n {
			return errorf(ErrInvalidGraph, "planner: checkpoint call %d (%q): node %d writes node %d, out of range", i, c.Name, j, node.Writes)
		}
	}
	if b := c.Buckets; b != nil {
		if len(b.Pieces) != n {
			return errorf(ErrInvalidGraph, "planner: checkpoint call %d (%q): %d bucket pieces for %d body nodes", i, c.Name, len(b.Pieces), n)
		}
		for j, p := range b.Pieces {
			if p < -1 {
				return errorf(ErrInvalidGraph, "planner: checkpoint call %d (%q): node %d: piece %d (use -1 for none)", i, c.Name, j, p)
			}
		}
		if b.ParamBytes < 0 || b.CapBytes < 1 || b.Buckets < 0 {
			return errorf(ErrInvalidConfig, "planner: checkpoint call %d (%q): bucket plan of %d bytes, cap %d, %d buckets", i, c.Name, b.ParamBytes, b.CapBytes, b.Buckets)
		}
	}
	return nil
}

// bodyBlocks counts the block instances a body holds.
func bodyBlocks(c *CheckpointCall) int {
	seen := map[int32]bool{}
	for _, n := range c.Nodes {
		if n.Block >= 0 {
			seen[n.Block] = true
		}
	}
	return len(seen)
}

// splitCall decides one call; byBuckets: its body's bucket plan (if it has
// one that says regions) groups its nodes instead of its blocks.
func splitCall(c *CheckpointCall, byBuckets bool) CheckpointSplit {
	s := CheckpointSplit{Boundary: "block", Blocks: bodyBlocks(c), Node: -1, Region: -1}
	group := func(j int) int32 { return c.Nodes[j].Block }
	if s.Blocks < 2 && byBuckets && c.Buckets != nil && c.Buckets.Regions {
		s.Boundary = "bucket"
		group = func(j int) int32 { return c.Buckets.Pieces[j] }
	}
	if s.Code, s.Node = callBlocker(c, s.Boundary == "bucket" || s.Blocks >= 2); s.Code == SplitDone {
		s.NodeRegion, s.Regions, s.Code, s.Node, s.Region = regionsOf(c, group)
	}
	if s.Code != SplitDone {
		s.NodeRegion, s.Regions = nil, nil
		if s.Boundary != "bucket" && s.Blocks < 2 {
			s.Boundary = ""
		}
	}
	return s
}

// callBlocker is the first reason, before any region is drawn, that keeps
// the call whole (Note [Checkpoint regions]), and the node it names (-1:
// none).
func callBlocker(c *CheckpointCall, groups bool) (KeptWhole, int32) {
	switch {
	case !groups:
		return WholeFewBlocks, -1
	case !c.IndexedOnly:
		return WholeResultUsed, -1
	case c.PolicyFunction:
		return WholePolicy, -1
	}
	for j, n := range c.Nodes {
		if n.Kind != BodyCompute && n.Kind != BodyGetAttr {
			continue
		}
		switch {
		case n.Random:
			return WholeRandom, int32(j)
		case n.StateChange:
			return WholeStateChange, -1
		case n.Nested:
			return WholeNested, -1
		}
	}
	return SplitDone, -1
}

// regionsOf draws the regions (Note [Checkpoint regions]) and their
// crossings, or says why the call stays whole (with the node or region the
// reason names, -1: none).
func regionsOf(c *CheckpointCall, group func(int) int32) (where []int32, regions []CheckpointRegion, code KeptWhole, node int32, region int) {
	nodes := c.Nodes
	where = make([]int32, len(nodes))
	users := make([][]int32, len(nodes))
	for j, n := range nodes {
		where[j] = -1
		for _, v := range n.Inputs {
			users[v] = append(users[v], int32(j))
		}
	}
	count, current := 1, int32(-1)
	for j, n := range nodes {
		if n.Kind != BodyCompute {
			continue
		}
		if g := group(j); g >= 0 && g != current {
			if current >= 0 {
				count++
			}
			current = g
		}
		where[j] = int32(count - 1)
	}
	for j, n := range nodes {
		if n.Kind != BodyGetAttr {
			continue
		}
		k := int32(-1)
		for _, u := range users[j] {
			if where[u] >= 0 && (k < 0 || where[u] < k) {
				k = where[u]
			}
		}
		where[j] = max(k, 0)
	}
	regions = make([]CheckpointRegion, count)
	for k := range regions {
		r := &regions[k]
		for j, n := range nodes {
			if where[j] != int32(k) {
				continue
			}
			for _, v := range n.Inputs {
				if where[v] == int32(k) || containsInt32(r.Inputs, v) {
					continue
				}
				value := &nodes[v]
				switch {
				case where[v] > int32(k):
					return nil, nil, WholeReadEarly, -1, -1
				case value.Kind == BodyGetAttr:
					return nil, nil, WholeAttribute, -1, -1
				case value.Kind != BodyPlaceholder && !value.Carries:
					return nil, nil, WholeNotCarried, v, -1
				}
				r.Inputs = append(r.Inputs, v)
			}
			if w := n.Writes; w >= 0 && where[w] != int32(k) {
				return nil, nil, WholeMutation, int32(j), -1
			}
			later := n.Returned
			for _, u := range users[j] {
				later = later || where[u] > int32(k)
			}
			if later {
				r.Outputs = append(r.Outputs, int32(j))
			}
		}
		if len(r.Outputs) == 0 {
			return nil, nil, WholeNothingOn, -1, k
		}
	}
	return where, regions, SplitDone, -1, -1
}

func containsInt32(xs []int32, x int32) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

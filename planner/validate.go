package planner

import "math"

// validateConfig checks the caps and mode before any graph work, so a bad
// option is reported even when the graph is also bad.
//
// It guards what crosses the C ABI, for any caller of it: the Python shim
// validates the user's options itself (one validator, with messages in the
// user's terms) and must never send a config that fails here, so these
// messages speak in Config's field names.
func validateConfig(cfg *Config) error {
	switch cfg.Mode {
	case ModeDDP, ModeTorch:
	default:
		return errorf(ErrInvalidConfig, "planner: unknown mode %d (valid: %d = ModeDDP, %d = ModeTorch)",
			cfg.Mode, ModeDDP, ModeTorch)
	}
	if cfg.BucketCapBytes <= 0 {
		return errorf(ErrInvalidConfig, "planner: BucketCapBytes must be > 0, got %d", cfg.BucketCapBytes)
	}
	if cfg.FirstBucketCapBytes <= 0 {
		return errorf(ErrInvalidConfig, "planner: FirstBucketCapBytes must be > 0, got %d", cfg.FirstBucketCapBytes)
	}
	if cfg.FirstBucketCapBytes > cfg.BucketCapBytes {
		return errorf(ErrInvalidConfig, "planner: FirstBucketCapBytes (%d) must not exceed BucketCapBytes (%d)",
			cfg.FirstBucketCapBytes, cfg.BucketCapBytes)
	}
	for i, c := range cfg.BucketCapsBytes {
		if c <= 0 {
			return errorf(ErrInvalidConfig, "planner: BucketCapsBytes[%d] must be > 0, got %d", i, c)
		}
	}
	if cfg.MaxPieces < 0 {
		return errorf(ErrInvalidConfig, "planner: MaxPieces must be >= 0 (0 means no limit), got %d", cfg.MaxPieces)
	}
	switch cfg.BucketOrder {
	case OrderReady, OrderDeclaration:
	default:
		return errorf(ErrInvalidConfig, "planner: unknown bucket order %d (valid: %d = OrderReady, %d = OrderDeclaration)",
			cfg.BucketOrder, OrderReady, OrderDeclaration)
	}
	if cfg.Mode == ModeTorch {
		if cfg.BucketOrder != OrderReady {
			return errorf(ErrInvalidConfig, "planner: BucketOrder is not supported in ModeTorch, which reproduces torch's DDPOptimizer exactly; use ModeDDP")
		}
		// ModeTorch is a faithful reproduction of torch's DDPOptimizer, which
		// has neither option; accepting them silently would misreport what
		// the plan reproduces.
		if cfg.MaxPieces != 0 {
			return errorf(ErrInvalidConfig, "planner: MaxPieces (%d) is not supported in ModeTorch, which reproduces torch's DDPOptimizer exactly; use ModeDDP",
				cfg.MaxPieces)
		}
		if len(cfg.BucketCapsBytes) != 0 {
			return errorf(ErrInvalidConfig, "planner: BucketCapsBytes is not supported in ModeTorch, which reproduces torch's DDPOptimizer exactly; use ModeDDP")
		}
		if cfg.AlignBuckets {
			return errorf(ErrInvalidConfig, "planner: AlignBuckets is not supported in ModeTorch, which reproduces torch's DDPOptimizer exactly: its buckets count storage bytes, repeated uses included, so they cannot serve as DDP's per-bucket caps; use ModeDDP")
		}
	}
	return nil
}

// validateGraph checks every structural promise that planning relies on.
// After it succeeds, every index the planners read is in range, every edge
// points forward, and the output node is the last node, so the planners
// need no further bounds checks of their own.
func validateGraph(g *Graph) error {
	if g == nil {
		return errorf(ErrInvalidGraph, "planner: graph is nil")
	}
	n := len(g.Ops)
	if n == 0 {
		return errorf(ErrInvalidGraph, "planner: graph has no nodes (it needs at least an output node)")
	}
	if n > math.MaxInt32 {
		return errorf(ErrInvalidGraph, "planner: graph has %d nodes, more than node indices (int32) can address", n)
	}
	if len(g.ModuleIDs) != n {
		return errorf(ErrInvalidGraph, "planner: ModuleIDs has %d entries, want one per node (%d)", len(g.ModuleIDs), n)
	}

	if g.BlockIDs != nil && len(g.BlockIDs) != n {
		return errorf(ErrInvalidGraph, "planner: BlockIDs has %d entries, want one per node (%d) or none", len(g.BlockIDs), n)
	}

	if err := validateCosts(g.NodeFlops, g.NodeBytes, n); err != nil {
		return err
	}

	output := -1
	for i, op := range g.Ops {
		if op < OpPlaceholder || op > OpOutput {
			return errorf(ErrInvalidGraph, "planner: node %d: op kind %d out of range [%d, %d]", i, op, OpPlaceholder, OpOutput)
		}
		if op == OpOutput {
			if output >= 0 {
				return errorf(ErrInvalidGraph, "planner: nodes %d and %d are both output nodes; a graph has exactly one", output, i)
			}
			output = i
		}
		if id := g.ModuleIDs[i]; id < -1 {
			return errorf(ErrInvalidGraph, "planner: node %d: module id %d is negative (use -1 for no module)", i, id)
		}
		if g.BlockIDs != nil && g.BlockIDs[i] < -1 {
			return errorf(ErrInvalidGraph, "planner: node %d: block id %d is negative (use -1 for no block)", i, g.BlockIDs[i])
		}
	}
	if output < 0 {
		return errorf(ErrInvalidGraph, "planner: graph has no output node")
	}
	if output != n-1 {
		return errorf(ErrInvalidGraph, "planner: output node %d is not the last node (graph has %d nodes)", output, n)
	}

	if err := checkCSR("ParamOffsets", "ParamIndex", g.ParamOffsets, n, len(g.ParamIndex)); err != nil {
		return err
	}
	if len(g.ParamRefs) != len(g.ParamIndex) {
		return errorf(ErrInvalidGraph, "planner: ParamRefs has %d entries, want one per ParamIndex entry (%d)",
			len(g.ParamRefs), len(g.ParamIndex))
	}
	numParams := len(g.Params)
	for i := range n {
		lo, hi := g.ParamOffsets[i], g.ParamOffsets[i+1]
		for k := lo; k < hi; k++ {
			p := g.ParamIndex[k]
			if p < 0 || int(p) >= numParams {
				return errorf(ErrInvalidGraph, "planner: node %d: parameter index %d out of range [0, %d)", i, p, numParams)
			}
			ref := g.ParamRefs[k]
			if ref > RefAttr {
				return errorf(ErrInvalidGraph, "planner: node %d: reference kind %d to parameter %d (%q) out of range [%d, %d]",
					i, ref, p, g.Params[p].Name, RefArg, RefAttr)
			}
			// Modules are counted once per identity in ModeTorch; a module
			// reference without an identity could not be deduplicated.
			if ref == RefModule && (g.Ops[i] == OpCallModule || g.Ops[i] == OpCallMethod) && g.ModuleIDs[i] < 0 {
				return errorf(ErrInvalidGraph, "planner: node %d: module reference to parameter %d (%q) but the node has no module id",
					i, p, g.Params[p].Name)
			}
		}
	}

	if err := checkCSR("UserOffsets", "Users", g.UserOffsets, n, len(g.Users)); err != nil {
		return err
	}
	for i := range n {
		lo, hi := g.UserOffsets[i], g.UserOffsets[i+1]
		for k := lo; k < hi; k++ {
			u := g.Users[k]
			if u < 0 || int(u) >= n {
				return errorf(ErrInvalidGraph, "planner: node %d: user index %d out of range [0, %d)", i, u, n)
			}
			if int(u) <= i {
				return errorf(ErrInvalidGraph, "planner: node %d: user %d does not come after it (edges must point forward in topological order)", i, u)
			}
			// A placeholder takes no inputs. The planners rely on this: a
			// user of a node always belongs to some piece or is the output.
			if g.Ops[u] == OpPlaceholder {
				return errorf(ErrInvalidGraph, "planner: node %d: user %d is a placeholder, which takes no inputs", i, u)
			}
		}
	}

	for p := range g.Params {
		prm := &g.Params[p]
		if prm.Bytes < 0 {
			return errorf(ErrInvalidGraph, "planner: parameter %d (%q): Bytes is negative (%d)", p, prm.Name, prm.Bytes)
		}
		if prm.StorageBytes < 0 {
			return errorf(ErrInvalidGraph, "planner: parameter %d (%q): StorageBytes is negative (%d)", p, prm.Name, prm.StorageBytes)
		}
	}
	return nil
}

// checkCSR checks one offsets array of a CSR list with n rows over a values
// array of numValues entries.
func checkCSR(offsetsName, valuesName string, offsets []int64, n, numValues int) error {
	if len(offsets) != n+1 {
		return errorf(ErrInvalidGraph, "planner: %s has %d entries, want number of nodes + 1 (%d)", offsetsName, len(offsets), n+1)
	}
	if offsets[0] != 0 {
		return errorf(ErrInvalidGraph, "planner: %s[0] is %d, want 0", offsetsName, offsets[0])
	}
	for i := range n {
		if offsets[i+1] < offsets[i] {
			return errorf(ErrInvalidGraph, "planner: %s decreases at node %d (%d then %d)", offsetsName, i, offsets[i], offsets[i+1])
		}
	}
	if offsets[n] != int64(numValues) {
		return errorf(ErrInvalidGraph, "planner: %s ends at %d but %s has %d entries", offsetsName, offsets[n], valuesName, numValues)
	}
	return nil
}

// validateBodies checks the body facts of a graph of n nodes whose module
// stacks hold numStrings strings (Note [Body stacks]).
func validateBodies(b *BodyFacts, n, numStrings int) error {
	if len(b.Calls) != n {
		return errorf(ErrInvalidGraph, "planner: body facts: %d call entries for %d nodes; want one per node", len(b.Calls), n)
	}
	for i, c := range b.Calls {
		if c < -1 || int(c) >= n {
			return errorf(ErrInvalidGraph, "planner: body facts: node %d belongs to call %d, out of range [-1, %d)", i, c, n)
		}
		if c >= 0 && b.Calls[c] != c {
			return errorf(ErrInvalidGraph, "planner: body facts: node %d belongs to node %d, which is no call (it belongs to %d); a call belongs to itself",
				i, c, b.Calls[c])
		}
	}
	if len(b.StackOffsets) == 0 {
		return errorf(ErrInvalidGraph, "planner: body facts: StackOffsets is empty; it needs one entry more than there are body nodes")
	}
	bodyNodes := len(b.StackOffsets) - 1
	if err := checkCSR("body Offsets", "StackOffsets' body nodes", b.Offsets, n, bodyNodes); err != nil {
		return err
	}
	for i := range n {
		if size := b.Offsets[i+1] - b.Offsets[i]; size != 0 && b.Calls[i] != int32(i) {
			return errorf(ErrInvalidGraph, "planner: body facts: node %d has %d body nodes but is no call; only a call has a body", i, size)
		}
	}
	if b.StackOffsets[0] != 0 {
		return errorf(ErrInvalidGraph, "planner: body facts: StackOffsets[0] is %d, want 0", b.StackOffsets[0])
	}
	for k := range bodyNodes {
		if b.StackOffsets[k+1] < b.StackOffsets[k] {
			return errorf(ErrInvalidGraph, "planner: body facts: StackOffsets decreases at body node %d (%d then %d)",
				k, b.StackOffsets[k], b.StackOffsets[k+1])
		}
	}
	if end := b.StackOffsets[bodyNodes]; end != int64(len(b.Paths)) || len(b.Types) != len(b.Paths) {
		return errorf(ErrInvalidGraph, "planner: body facts: StackOffsets ends at %d but there are %d paths and %d types; want one path and one type per entry",
			end, len(b.Paths), len(b.Types))
	}
	for k := range b.Paths {
		for _, ref := range [2]struct {
			what string
			idx  int32
		}{{"path", b.Paths[k]}, {"type", b.Types[k]}} {
			if ref.idx < 0 || int(ref.idx) >= numStrings {
				return errorf(ErrInvalidGraph, "planner: body stack entry %d: %s string %d out of range [0, %d)",
					k, ref.what, ref.idx, numStrings)
			}
		}
	}
	return nil
}

// validateCosts checks the optional node costs (Note [Edge costs]): both or
// neither, one of each per node, none negative.
func validateCosts(flops, bytes []int64, n int) error {
	if (flops == nil) != (bytes == nil) {
		return errorf(ErrInvalidGraph, "planner: NodeFlops and NodeBytes go together: give both or neither")
	}
	for _, c := range [2]struct {
		what   string
		values []int64
	}{{"NodeFlops", flops}, {"NodeBytes", bytes}} {
		if c.values == nil {
			continue
		}
		if len(c.values) != n {
			return errorf(ErrInvalidGraph, "planner: %s has %d entries, want one per node (%d) or none", c.what, len(c.values), n)
		}
		for i, v := range c.values {
			if v < 0 {
				return errorf(ErrInvalidGraph, "planner: node %d: %s is %d; a cost is at least 0", i, c.what, v)
			}
		}
	}
	return nil
}

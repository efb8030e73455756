package planner

import "slices"

// This file is the planner's one entry point for a caller that holds a
// graph and the user's and DDP's settings: Decide makes, in one call, every
// decision that needs no torch object. The caller then only cuts, compiles
// and talks to DDP.
//
// Note [One call]: Decide resolves the caps (settings.go), assigns the
// blocks (modstack.go), plans (Build), decides whether DDP's buckets can be
// set to the pieces (planning a second time, unaligned, when they cannot),
// clamps the caps handed to DDP, lists each piece's parameters and picks the
// edge pieces (edges.go). Build stays the pure planner of one Config, under
// the golden, oracle and fuzz tests; Decide's own rules have their tests
// beside it (decide_test.go, modstack_test.go).

// Request is one graph to plan and what is known about it.
type Request struct {
	Graph    *Graph
	Stacks   *ModuleStacks // optional: per-node module stacks, for Settings.BlockCuts
	Settings Settings
}

// AlignReason says whether DDP's buckets are set to the pieces, and if not
// why (Decision.AlignReason).
type AlignReason int32

const (
	// ReasonAligned: the plan's buckets are DDP's; Plan.DDPCaps are the caps.
	ReasonAligned AlignReason = 0
	// ReasonOff: alignment was not asked for (Settings.AlignBuckets false).
	ReasonOff AlignReason = 1
	// ReasonNotCovered: the aligned buckets would not hold exactly DDP's
	// parameters (a graph break, or parameters used outside this graph);
	// the plan is the unaligned one.
	ReasonNotCovered AlignReason = 2
	// ReasonOnePiece: the aligned plan has a single piece, so there is
	// nothing to align; the plan is that single piece.
	ReasonOnePiece AlignReason = 3
	// ReasonPartOfForward: as ReasonNotCovered (a graph break left part of
	// DDP's parameters in other graphs), in ready order: the plan stays the
	// aligned one (the same cuts), whose buckets and DDPCaps the caller
	// combines with the forward's other graphs (CombineForward,
	// forward.go); Config.AlignBuckets is false, since no cap list of this
	// graph alone may go to DDP.
	ReasonPartOfForward AlignReason = 4
	// ReasonNoParams: the graph holds no parameter DDP reduces (a graph
	// break's parameter-free frame); the plan is one piece, made without
	// Build: nothing to cut, align or agree on (Note [Parameter-free graphs]).
	ReasonNoParams AlignReason = 5
	// ReasonNoPerBucketCaps .. ReasonBuiltinCommHook: facts about the DDP
	// module refuse alignment (Note [Alignment refusals], refusals.go); the
	// plan is the unaligned one.
	ReasonNoPerBucketCaps AlignReason = 6
	ReasonPythonReducer   AlignReason = 7
	// 8, 11 and 12 were static_graph, delay_all_reduce_named_params and
	// several (dtype, device) groups, all aligned now; the others keep
	// their numbers.
	ReasonMixedPrecision  AlignReason = 9
	ReasonBuiltinCommHook AlignReason = 10
	// ReasonGroupsLater: several (dtype, device) groups, whose per-group
	// caps would launch DDP's buckets later than DDP's own buckets do
	// (Note [Several dtype groups], keys.go; Note [Declaration order per
	// group], declorder.go); the plan is the unaligned one.
	ReasonGroupsLater AlignReason = 13
)

// Decision is Decide's answer.
type Decision struct {
	Plan *Plan
	// Config holds the caps and switches the plan stands for: those Build
	// planned with, except that when DDP's buckets are not set to the
	// pieces (AlignReason != ReasonAligned) AlignBuckets is false and
	// BucketOrder is OrderReady, the order the unaligned cuts follow (DDP's
	// own buckets may follow another: under find_unused_parameters it
	// keeps declaration order).
	Config Config
	// AlignReason says whether DDP's buckets are the pieces, and if not
	// why; the caller words it.
	AlignReason AlignReason
	// AlignedParams (ReasonNotCovered, ReasonPartOfForward): the parameters
	// the aligned buckets hold, against DDPSettings.NumParams.
	AlignedParams int
	// CountedParams counts the parameters of the table that DDP reduces
	// (RequiresGrad, not Ignored), used by the graph or not.
	CountedParams int
	// PieceParams lists, per piece in forward order, its parameters in
	// forward order. ModeDDP: the bucketed parameters first used in the
	// piece (a bucket may span pieces). ModeTorch: the parameters of the
	// bucket the piece completes, as torch counts them (a tied weight in
	// each bucket that uses it).
	PieceParams [][]int32
	// EagerPieces are the edge pieces to run eagerly (Note [Edges]).
	EagerPieces []int32
	// BlockIDs is the block assignment the plan used (nil: none).
	BlockIDs []int32
	// DDPBucketOrder is the order in which the DDP module fills its own
	// buckets, from its flags, whether or not they are set to the pieces
	// (OrderReady without a DDP module).
	DDPBucketOrder BucketOrder
	// CheckpointRegions (Settings.UniformCaps only): the body is to be
	// split into one checkpoint region per piece (Note [Uniform caps]).
	CheckpointRegions bool
}

// decider holds the state of one Decide call.
type decider struct {
	req *Request
	s   *Settings
	g   Graph // the request's graph with the derived BlockIDs
	// stacks: the request's module stacks seen through bodies (Note
	// [Body stacks]), set by checkStacks.
	stacks *ModuleStacks
	out    Decision
	// partOnly: the aligned buckets hold DDP's parameters, each once, but
	// not all of them (set by covers).
	partOnly bool
}

// Decide validates req and makes every decision of Note [One call]. Like
// Build it keeps no state and gives identical answers for identical inputs;
// the plan and its fingerprint are Build's for the resolved Config.
func Decide(req *Request) (*Decision, error) {
	if req == nil || req.Graph == nil {
		return nil, errorf(ErrInvalidGraph, "planner: request has no graph")
	}
	d := &decider{req: req, s: &req.Settings, g: *req.Graph}
	if err := validateGraph(&d.g); err != nil {
		return nil, err
	}
	if d.s.DDP != nil {
		d.out.DDPBucketOrder = d.s.DDP.bucketOrder()
	}
	if err := d.checkStacks(); err != nil {
		return nil, err
	}
	if d.countParams(); d.out.CountedParams == 0 {
		d.parameterFree()
		return &d.out, nil
	}
	if err := checkSettings(d.s); err != nil {
		return nil, err
	}
	if err := d.assignBlocks(); err != nil {
		return nil, err
	}
	if err := d.plan(); err != nil {
		return nil, err
	}
	d.clampCaps()
	d.pieceParams()
	d.out.EagerPieces = eagerPieces(&d.g, d.out.Plan.NodePiece, d.out.Plan.NumPieces, d.s.Edges)
	d.out.BlockIDs = d.g.BlockIDs
	d.out.CheckpointRegions = checkpointRegions(d.s, d.out.Plan)
	return &d.out, nil
}

// parameterFree makes the decision for a graph without DDP parameters.
//
// Note [Parameter-free graphs]: a graph that holds no parameter DDP reduces
// (what a trainer's graph break leaves behind, e.g. after Lightning's
// self.log) has nothing to cut, align or agree on. Its decision is one
// piece with no bucket, made before the settings are checked or Build
// runs, so that no cap or option that only a plan needs can fail it: the
// caller compiles it whole, outside the ranks' agreement, with no warning.
// Config holds the resolved caps, unchecked, for the record.
func (d *decider) parameterFree() {
	g := &d.g
	pl := &Plan{NodePiece: piecesFromCuts(g.Ops, nil)}
	if slices.ContainsFunc(g.Ops, isCompute) {
		pl.NumPieces = 1
	}
	pl.PieceInputs, pl.PieceOutputs = crossings(g, pl.NodePiece, pl.NumPieces)
	cfg := d.s.resolve(false)
	pl.Fingerprint = fingerprint(g, &cfg, pl)
	d.out.Plan, d.out.Config = pl, cfg
	d.out.AlignReason = ReasonNoParams
	d.out.PieceParams = make([][]int32, pl.NumPieces)
}

// assignBlocks derives Graph.BlockIDs from the module stacks under
// Settings.BlockCuts (Note [Block rule]).
func (d *decider) assignBlocks() error {
	if st := d.stacks; st != nil && d.s.BlockCuts {
		d.g.BlockIDs = assignBlocks(&d.g, st)
	}
	return nil
}

// checkStacks checks the request's module stacks, if any, against the graph.
func (d *decider) checkStacks() error {
	st := d.req.Stacks
	if st == nil {
		return nil
	}
	if d.g.BlockIDs != nil {
		return errorf(ErrInvalidGraph, "planner: both BlockIDs and module stacks given; give the module stacks and let the planner assign the blocks")
	}
	if err := validateStacks(st, len(d.g.Ops)); err != nil {
		return err
	}
	d.stacks = st.throughBodies()
	return nil
}

// plan builds the plan, aligned if asked and possible; see AlignReason.
func (d *decider) plan() error {
	s := d.s
	if !s.AlignBuckets {
		return d.build(s.resolve(false), ReasonOff)
	}
	if s.DDP != nil {
		if r := s.DDP.refusal(); r != ReasonAligned {
			return d.build(s.resolve(false), r)
		}
	}
	if err := d.build(s.resolve(true), ReasonAligned); err != nil || s.DDP == nil {
		return err
	}
	if planned, covered, err := d.covers(); err != nil {
		return err
	} else if !covered {
		if d.partOnly && d.out.Config.BucketOrder == OrderReady && len(d.out.Plan.Buckets) > 0 {
			if d.out.Plan.Alignment == AlignReadyGroups {
				// Whole units: CombineForward splits the forward's by group.
				pl, err := build(&d.g, d.out.Config, false)
				if err != nil {
					return err
				}
				d.out.Plan = pl
			}
			d.out.Config.AlignBuckets = false
			d.out.AlignReason, d.out.AlignedParams = ReasonPartOfForward, planned
			return nil
		}
		if err := d.build(s.resolve(false), ReasonNotCovered); err != nil {
			return err
		}
		d.out.AlignedParams = planned
		return nil
	}
	if al := d.out.Plan.Alignment; al == AlignReadyGroups || al == AlignDeclarationGroups {
		cfg := s.resolve(false)
		own, err := Build(&d.g, cfg)
		if err != nil {
			return err
		}
		// DDP's own buckets: rebuilt in ready order as the unaligned plan
		// predicts, or kept in declaration order; both bucketings then
		// launch on the unaligned plan's pieces.
		aligned, rival := d.out.Plan, own
		if al == AlignDeclarationGroups {
			var buckets [][]int32
			for _, b := range aligned.Buckets {
				buckets = append(buckets, b.Params)
			}
			aligned, rival = launchedOn(&d.g, own, buckets), launchedOn(&d.g, own, declaredOwn(&d.g, capList(&cfg)))
		}
		if launchesLater(aligned, rival) {
			d.out.Plan, d.out.Config, d.out.AlignReason = own, cfg, ReasonGroupsLater
			return nil
		}
	}
	if d.out.Plan.NumPieces <= 1 {
		pl := d.out.Plan
		pl.Alignment, pl.DDPCaps = AlignNone, nil
		d.out.Config.AlignBuckets, d.out.Config.BucketOrder = false, OrderReady
		d.out.AlignReason = ReasonOnePiece
	}
	return nil
}

// build plans under cfg and records the outcome.
func (d *decider) build(cfg Config, reason AlignReason) error {
	pl, err := Build(&d.g, cfg)
	if err != nil {
		return err
	}
	d.out.Plan, d.out.Config, d.out.AlignReason = pl, cfg, reason
	return nil
}

// covers reports whether the aligned buckets hold exactly DDP's parameters
// (by DDP position), and how many parameters they hold. Unknown
// (DDPSettings.NumParams 0) counts as covered.
func (d *decider) covers() (planned int, covered bool, err error) {
	n := d.s.DDP.NumParams
	if n == 0 {
		return 0, true, nil
	}
	for p := range d.g.Params {
		if pos := d.g.Params[p].DDPPosition; pos < -1 || int(pos) >= n {
			return 0, false, errorf(ErrInvalidGraph, "planner: parameter %d (%q): DDP position %d out of range [-1, %d) for DDP's %d parameters",
				p, d.g.Params[p].Name, pos, n, n)
		}
	}
	seen := make([]bool, n)
	covered = true
	for _, b := range d.out.Plan.Buckets {
		for _, p := range b.Params {
			planned++
			pos := d.g.Params[p].DDPPosition
			if pos < 0 || seen[pos] {
				covered = false
				continue
			}
			seen[pos] = true
		}
	}
	d.partOnly = covered && planned < n
	return planned, covered && planned == n, nil
}

// clampCaps raises every cap handed to DDP to at least 1 byte: a bucket of
// zero-byte parameters only (possible for the forward-first piece) would
// otherwise get cap 0, which makes DDP give each of them a bucket of its
// own.
func (d *decider) clampCaps() {
	caps := d.out.Plan.DDPCaps
	for k := range caps {
		caps[k] = max(1, caps[k])
	}
}

func (d *decider) countParams() {
	for p := range d.g.Params {
		if d.g.Params[p].counted() {
			d.out.CountedParams++
		}
	}
}

// pieceParams fills Decision.PieceParams (see there).
func (d *decider) pieceParams() {
	pl, g := d.out.Plan, &d.g
	per := make([][]int32, pl.NumPieces)
	if d.out.Config.Mode == ModeTorch {
		// Buckets are in DDP order (last piece first) and list parameters
		// in gradient-ready order; walking both backwards gives forward
		// order.
		for k := len(pl.Buckets) - 1; k >= 0; k-- {
			b := &pl.Buckets[k]
			if b.Piece >= 0 && b.Piece < pl.NumPieces {
				for j := len(b.Params) - 1; j >= 0; j-- {
					per[b.Piece] = append(per[b.Piece], b.Params[j])
				}
			}
		}
		d.out.PieceParams = per
		return
	}
	bucketed := make([]bool, len(g.Params))
	for _, b := range pl.Buckets {
		for _, p := range b.Params {
			bucketed[p] = true
		}
	}
	firstUse, _ := firstUses(g) // cannot fail: Build bounded the same sums
	for i, piece := range pl.NodePiece {
		if piece < 0 {
			continue
		}
		for _, p := range g.ParamIndex[g.ParamOffsets[i]:g.ParamOffsets[i+1]] {
			if bucketed[p] && int(firstUse[p]) == i {
				per[piece] = append(per[piece], p)
				bucketed[p] = false // listed once, at its first reference
			}
		}
	}
	d.out.PieceParams = per
}

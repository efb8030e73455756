package planner

import "fmt"

// Bucket is one allreduce bucket of a Plan.
type Bucket struct {
	Bytes     int64   // counted bytes (storage bytes in ModeTorch, numel*element size in ModeDDP)
	Params    []int32 // parameter indices in gradient-ready order
	NodeBegin int     // first node (forward order) holding its parameters
	NodeEnd   int     // one past the last such node
	Piece     int     // the piece whose backward completes it (declaration alignments: at whose end DDP launches it)
	Extended  bool    // its cut moved so that the piece has an output
	DType     int32   // grouping key in ModeDDP; -1 in ModeTorch
	Device    int32
}

// Plan is the result of Build.
type Plan struct {
	Fingerprint  uint64
	NodePiece    []int32 // piece of each node; -1 for placeholders and the output
	NumPieces    int
	Buckets      []Bucket  // DDP order: bucket 0 holds the gradients ready first
	PieceInputs  [][]int32 // per piece: nodes from outside it that it reads, ascending
	PieceOutputs [][]int32 // per piece: its nodes read by later pieces or the output, ascending

	// Alignment says how the buckets relate to DDP's (AlignNone unless
	// Config.AlignBuckets); DDPCaps are then the per-bucket caps to give
	// DDP, in the order DDP walks them; MergedCuts counts the cuts that
	// AlignDeclarationMerged dropped.
	Alignment  Alignment
	DDPCaps    []int64
	MergedCuts int

	// BlockRuns says that the pieces begin only at block runs (planBlocks,
	// blocks.go): ModeDDP, at least two runs of Graph.BlockIDs, and a
	// BucketOrder other than OrderDeclaration. False: the cuts follow the
	// bytes (or torch's rule). The shim reads it to decide where to split
	// a checkpoint (python/goddp/graph/checkpoints.py, Note [Checkpoint
	// bodies]).
	BlockRuns bool
}

// ErrorCode classifies a Build failure. The values match goddp_status in
// csrc/goddp.h.
type ErrorCode int32

const (
	ErrInvalidConfig ErrorCode = 1
	ErrInvalidGraph  ErrorCode = 2
	ErrOverflow      ErrorCode = 3
)

// Error is the error type Build returns.
type Error struct {
	Code ErrorCode
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

func errorf(code ErrorCode, format string, args ...any) error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Build validates g and cfg and plans the cuts. It never modifies g or cfg,
// keeps no state between calls, and gives identical plans (and fingerprints)
// for identical inputs, so every rank that plans the same graph agrees. Any
// failure is an *Error whose Code says whether the config, the graph or a
// byte sum was at fault.
func Build(g *Graph, cfg Config) (*Plan, error) {
	return build(g, cfg, true)
}

// build is Build; with splitGroups false an aligned ready-order plan keeps
// one bucket per unit, every group in it (a graph of a split forward:
// CombineForward splits the forward's buckets by group).
func build(g *Graph, cfg Config, splitGroups bool) (*Plan, error) {
	if err := validateConfig(&cfg); err != nil {
		return nil, err
	}
	if err := validateGraph(g); err != nil {
		return nil, err
	}
	if err := validateDeclaration(g, &cfg); err != nil {
		return nil, err
	}
	lastUser := lastUsers(g)
	var (
		pl  *Plan
		err error
	)
	if cfg.Mode == ModeTorch {
		pl, err = planTorch(g, &cfg, lastUser)
	} else if runs := blockRuns(g); len(runs) >= 2 && cfg.BucketOrder != OrderDeclaration {
		// Block grouping (blocks.go) is made for DDP's ready-order rebuild;
		// under OrderDeclaration DDP never rebuilds, so those plans keep the
		// byte-driven cuts that declorder.go aligns.
		pl, err = planBlocks(g, &cfg, lastUser, runs)
		if pl != nil {
			pl.BlockRuns = true
		}
	} else {
		pl, err = planDDP(g, &cfg, lastUser)
	}
	if err != nil {
		return nil, err
	}
	if pl.Alignment == AlignReady && splitGroups {
		alignKeys(g, pl)
	}
	pl.PieceInputs, pl.PieceOutputs = crossings(g, pl.NodePiece, pl.NumPieces)
	pl.Fingerprint = fingerprint(g, &cfg, pl)
	return pl, nil
}

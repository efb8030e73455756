package planner

import "fmt"

// Note [A plan's notes]: besides its table, a graph's plan deserves a few
// INFO lines, each at most once per DDP module (the shim keeps the "once"):
// DDP's own buckets will not follow the cuts, and why (alignment asked for
// and refused, a stand-in module); the graph is one of a forward planned
// across graphs (every such graph says so); find_unused_parameters=True
// without alignment; and how declaration-order caps were made. They follow
// from the plan and from facts the shim read (PlanNotesRequest); the
// words are goddp's users' (testdata/words.golden).

// PlanNotesRequest is what the plan notes follow from.
type PlanNotesRequest struct {
	// Mode and AlignRequested are the user's options (mode, align_buckets).
	Mode           Mode
	AlignRequested bool
	// The plan's: DDP's own bucket order, the order and alignment its caps
	// were made for, its alignment in words, merged cuts and pieces.
	DDPBucketOrder BucketOrder
	Aligned        bool // the plan's caps align DDP's buckets
	CapsOrder      BucketOrder
	Alignment      string
	MergedCuts     int
	NumPieces      int
	// NotAligned says why DDP's buckets are not the pieces (nil: they are).
	NotAligned *string
	// StandIn: the module is no real DDP (NotAligned says so); PartOfForward:
	// the graph holds part of DDP's parameters; Frame names the graph.
	StandIn, PartOfForward bool
	Frame                  string
}

// PlanNote is one INFO line; Once: at most once per DDP module (else every
// time).
type PlanNote struct {
	Text string
	Once bool
}

// PlanNotes is the settings line (logged only at a DDP module's first
// plan; "" for none) and the other notes, in order.
type PlanNotes struct {
	Settings string
	Notes    []PlanNote
}

const unalignedDeclarationNote = "goddp: this DDP module has find_unused_parameters=True and static_graph=False, so DDP " +
	"never rebuilds its buckets: they stay in parameter declaration order while goddp's " +
	"cuts follow gradient-ready order, and align_buckets is off. Cuts still overlap " +
	"communication, but buckets may not close exactly at them."

// NotesFor is a plan's notes (Note [A plan's notes]).
func NotesFor(req *PlanNotesRequest) *PlanNotes {
	out := &PlanNotes{}
	if req.DDPBucketOrder == OrderDeclaration && req.Mode == ModeDDP && !req.AlignRequested {
		out.Settings = unalignedDeclarationNote
	}
	switch {
	case req.StandIn:
		out.Notes = append(out.Notes, PlanNote{Text: "goddp: " + orNone(req.NotAligned), Once: true})
	case req.PartOfForward:
		out.Notes = append(out.Notes, PlanNote{Text: fmt.Sprintf("goddp: %s: %s", req.Frame, orNone(req.NotAligned))})
	case req.NotAligned != nil && req.AlignRequested:
		out.Notes = append(out.Notes, PlanNote{Text: "goddp: DDP keeps its own buckets, which may straddle the cuts: " + *req.NotAligned, Once: true})
	}
	if req.Aligned && req.CapsOrder == OrderDeclaration {
		text := "goddp: find_unused_parameters=True: DDP never rebuilds its buckets and keeps the ones it " +
			fmt.Sprintf("fills in declaration order, so goddp gives it caps for that order (%s)", req.Alignment)
		if req.MergedCuts != 0 {
			text += fmt.Sprintf("; no bucket could start at %d of the cuts, so those pieces were merged (%d pieces remain)",
				req.MergedCuts, req.NumPieces)
		}
		out.Notes = append(out.Notes, PlanNote{Text: text, Once: true})
	}
	return out
}

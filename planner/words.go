package planner

import (
	"fmt"
	"slices"
	"strings"
)

// Note [Words from the planner]
//
// What goddp tells its users about the ranks' agreement (the outcome line
// of a round, the refusals of a forward planned across graphs and the line
// that announces it) is decided from facts the planner already holds: the
// verdict, the members' layouts, orders and reasons. So the planner writes
// those lines too, and the shim only logs them, at the level the planner
// names. Each text is the one goddp's users and tests read
// (testdata/words.golden); the shim adds nothing to it.

// LogLine is one line for goddp's logger.
type LogLine struct {
	Warning bool // WARNING; otherwise INFO
	Text    string
}

// AgreeGroup names the process group of an agreement round, for the
// outcome line only.
type AgreeGroup struct {
	Name string
	Size int
}

// outcomeLine is the line every rank logs once a round has decided
// (Note [Words from the planner]); v is not an error verdict.
func outcomeLine(v *Verdict, g *AgreeGroup) *LogLine {
	where := fmt.Sprintf("%d rank(s) of process group %s", g.Size, pyRepr(g.Name))
	switch {
	case v.Action == ActionInstall:
		return &LogLine{Text: fmt.Sprintf("goddp: DDP's %d buckets now close at piece boundaries on all %s (per-bucket caps %s bytes)",
			len(v.Record.Caps), where, intList(v.Record.Caps))}
	case v.Action == ActionLater:
		return &LogLine{Text: fmt.Sprintf("goddp: the %s decide DDP's buckets at the module's next training call", where)}
	case v.Disagreed:
		return &LogLine{Warning: true, Text: fmt.Sprintf("goddp: DDP keeps its own buckets on all %s: %s. Gradients stay exact; "+
			"only the overlap of allreduces with backward is smaller.", where, orNone(v.Reason))}
	}
	return &LogLine{Text: fmt.Sprintf("goddp: DDP keeps its own buckets on all %s: %s", where, orNone(v.Reason))}
}

// ForwardMember is one graph of a forward recorded across a graph break
// (python/goddp/ranks/forward.py, Note [Graphs of one forward]), in call
// order.
type ForwardMember struct {
	// Layout is the graph's aligned layout; nil when it has none (Reason
	// says why: alignment off, a fallback, no plan).
	Layout   *Layout
	Reason   *string
	Describe string // how the lines name the graph
}

// ForwardRequest is a forward's members and DDP's parameters' byte sizes
// (by DDP position); Build names the goddp build for the combined layout.
type ForwardRequest struct {
	Members    []ForwardMember
	ParamBytes []int64
	Build      string
}

// ForwardOutcome is the one layout of a forward's graphs, or why there is
// none, and the line that announces it.
type ForwardOutcome struct {
	// Layout (OrderReady, Build) and its Digest; nil when Refusal says why
	// not.
	Layout  *Layout
	Digest  *uint64
	Refusal *string
	// Graphs describes the members, in call order; Combined is
	// CombineForward's plan (nil where the members were refused before it).
	Graphs   []string
	Combined *ForwardPlan
	Note     LogLine
}

// PlanForward combines the members of a forward into one layout (Note
// [Graphs of one forward] in python/goddp/ranks/forward.py): it refuses a
// forward where some graph has no layout, or where not all were bucketed
// in "ready" order; otherwise it is CombineForward's layout, and an error
// of CombineForward (or of the layout's digest) is the refusal, in its
// first line. It fails only for a member layout with an unknown order.
func PlanForward(req *ForwardRequest) (*ForwardOutcome, error) {
	out := &ForwardOutcome{Graphs: make([]string, len(req.Members))}
	for i, m := range req.Members {
		out.Graphs[i] = m.Describe
		if m.Layout != nil && m.Layout.Order != OrderReady && m.Layout.Order != OrderDeclaration {
			return nil, errorf(ErrInvalidConfig, "planner: graph %d of the forward has layout bucket order %d; want %d (ready) or %d (declaration)",
				i, m.Layout.Order, OrderReady, OrderDeclaration)
		}
	}
	out.Refusal = forwardRefusal(req.Members)
	if out.Refusal == nil {
		out.combine(req)
	}
	how := ""
	if out.Layout != nil {
		how = fmt.Sprintf("DDP buckets %s bytes", intList(out.Layout.Caps))
	} else {
		how = "no layout: " + orNone(out.Refusal)
	}
	out.Note = LogLine{Text: fmt.Sprintf("goddp: planning the %d graph(s) of this DDP module's first training forward together: %s; %s",
		len(req.Members), strings.Join(out.Graphs, "; "), how)}
	return out, nil
}

// forwardRefusal is why the members cannot be combined before looking at
// their buckets: a member without a layout (the first such), or an order
// other than "ready" (which also refuses a forward of no graph).
func forwardRefusal(members []ForwardMember) *string {
	for _, m := range members {
		if m.Layout == nil {
			return ptr(fmt.Sprintf("a graph of the forward has no layout to combine (%s: %s)", m.Describe, orNone(m.Reason)))
		}
	}
	ready := len(members) > 0
	for _, m := range members {
		ready = ready && m.Layout.Order == OrderReady
	}
	if !ready {
		return ptr("the forward's graphs are bucketed in declaration order, which DDP never rebuilds")
	}
	return nil
}

// combine runs CombineForward on the members' buckets and states the
// result's digest.
func (out *ForwardOutcome) combine(req *ForwardRequest) {
	graphs := make([]ForwardGraph, len(req.Members))
	for i, m := range req.Members {
		for _, b := range m.Layout.Buckets {
			graphs[i].Buckets = append(graphs[i].Buckets, b.Positions)
		}
	}
	plan, err := CombineForward(graphs, req.ParamBytes)
	if err != nil {
		out.Refusal = ptr(firstLine(err.Error(), "PlannerError"))
		return
	}
	out.Combined = plan
	layout := &Layout{Caps: plan.Caps, Order: OrderReady, Build: req.Build}
	for _, b := range plan.Buckets {
		layout.Buckets = append(layout.Buckets, LayoutBucket{Positions: b.Params})
	}
	d, err := LayoutDigest(layout)
	if err != nil {
		out.Refusal = ptr(fmt.Sprintf("could not state DDP's layout (PlannerError: %s)", err.Error()))
		return
	}
	out.Layout, out.Digest = layout, &d
}

// firstLine is text's first line once surrounding white space is trimmed,
// or empty when there is none.
func firstLine(text, empty string) string {
	text = strings.TrimSpace(text)
	if i := strings.IndexAny(text, "\r\n"); i >= 0 {
		text = text[:i]
	}
	if text == "" {
		return empty
	}
	return text
}

// FollowRequest is a graph that first runs after its DDP module decided
// (python/goddp/ranks/agreement.py, Note [Where the ranks meet]): it never
// re-buckets training, it follows the module's decision.
type FollowRequest struct {
	// Action and Reason are the module's verdict; Decided is the layout
	// every rank installed (Install only).
	Action  Action
	Reason  *string
	Decided *Layout
	// Mine is the layout this graph proposes (nil: none); Part, when Mine
	// is nil, the graph's layout for its part of DDP's parameters (a graph
	// of a forward planned across graphs).
	Mine, Part *Layout
}

// Following is what a later graph's plan record says, and the line it
// logs.
type Following struct {
	// Installed: the module's buckets are goddp's (the plan record's
	// "plan_check" aligned).
	Installed bool
	// Aligned: DDP's buckets are this graph's own layout (the record's
	// "ddp_buckets" aligned).
	Aligned bool
	// Reason says why DDP's buckets are not this graph's own; nil when they
	// are (the record's "ddp_buckets").
	Reason *string
	// Log is the INFO line for a graph whose buckets differ from DDP's
	// installed ones (nil otherwise).
	Log *LogLine
}

// Followed is the plan record's "followed" entry of a later graph.
const Followed = "the decision of the module's first training call"

// Follow says how a later graph stands with its module's decision.
func Follow(req *FollowRequest) (*Following, error) {
	f := &Following{Installed: req.Action == ActionInstall}
	switch req.Action {
	case ActionLater:
		f.Reason = ptr("the ranks decide at this DDP module's next training call")
		return f, nil
	case ActionKeep:
		f.Reason = ptr("decided at this DDP module's first training call: " + orNone(req.Reason))
		return f, nil
	case ActionInstall:
	default:
		return nil, errorf(ErrInvalidConfig, "planner: Follow: action %d is not a verdict", int32(req.Action))
	}
	if req.Decided == nil {
		return nil, errorf(ErrInvalidConfig, "planner: Follow: an install verdict needs its layout")
	}
	if req.Mine != nil && sameLayout(req.Mine, req.Decided) {
		f.Aligned = true
		return f, nil
	}
	proposed := "none"
	switch {
	case req.Mine != nil:
		proposed = intList(req.Mine.Caps)
	case req.Part != nil:
		proposed = intList(req.Part.Caps) + " for its part of DDP's parameters"
	}
	f.Reason = ptr(fmt.Sprintf("DDP's buckets were set at this DDP module's first training call (%s bytes) and never "+
		"change mid-training; this graph proposed %s", intList(req.Decided.Caps), proposed))
	f.Log = &LogLine{Text: "goddp: a later graph of a DDP module keeps its buckets: " + *f.Reason}
	return f, nil
}

// sameLayout: the same buckets (positions in order), caps, order and build.
func sameLayout(a, b *Layout) bool {
	if a.Order != b.Order || a.Build != b.Build || !slices.Equal(a.Caps, b.Caps) || len(a.Buckets) != len(b.Buckets) {
		return false
	}
	for k := range a.Buckets {
		if !slices.Equal(a.Buckets[k].Positions, b.Buckets[k].Positions) {
			return false
		}
	}
	return true
}

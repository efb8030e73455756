package planner

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// This file holds goddp.trace's figures: what the recorded times of each
// DDP bucket's allreduce say about its overlap with backward, and the
// summary text. Python records the events (torch hooks, CUDA events) and
// hands them over as seconds from backward start; everything here is
// arithmetic and formatting on those numbers.
//
// Note [Trace figures]: a step's backward compute ends when autograd ran
// its last node (compute_end_s). Exposed communication is the time from
// that end to the last allreduce's completion, 0 when they all completed
// before. The overlapped share is the part of the time during which some
// allreduce was in flight (the union of the launch-to-done intervals) that
// lies before the compute end; 1 when nothing was in flight. A bucket
// counts as launched during backward when backward still had at least
// DuringBackwardMargin of its duration left: the last bucket is always
// launched just before the end (an unsplit compiled graph launches none
// before its single backward node has finished). The head start weighs
// how long before the compute end each byte's allreduce started, with no
// threshold: about 0 for an unsplit graph. The median step is the one
// with the median backward time (the upper of two).

// DuringBackwardMargin is the share of backward that must be left for a
// launch to count as during backward (Note [Trace figures]).
const DuringBackwardMargin = 0.05

// TraceBucket is one bucket's allreduce in one step, times in seconds from
// backward start. DoneS is nil in a recorded step whose future never
// completed; a normalized step always has it.
type TraceBucket struct {
	Index      int      `json:"index"`
	Bytes      int64    `json:"bytes"`
	Params     int      `json:"params"`
	ParamNames []string `json:"param_names"`
	LaunchS    float64  `json:"launch_s"`
	DoneS      *float64 `json:"done_s"`
}

// TraceStep is one backward pass that reduced gradients. Recorded, its
// compute end may be missing (nil) and its buckets in the host's order;
// normalized (Normalize), it has a compute end and its buckets in launch
// order.
type TraceStep struct {
	StartSeen   bool          `json:"start_seen"`
	ComputeEndS *float64      `json:"compute_end_s"`
	FinalizedS  *float64      `json:"finalized_s"`
	Buckets     []TraceBucket `json:"buckets"`
}

// TracePlan is what a trace record says of one goddp plan of the module
// (TracedPlan, Note [A trace's plans]); nil fields print as None.
type TracePlan struct {
	Fingerprint *string       `json:"fingerprint"`
	Mode        *string       `json:"mode"`
	NumPieces   *int          `json:"num_pieces"`
	BucketBytes []int64       `json:"bucket_bytes"`
	Fallback    *string       `json:"fallback"`
	Forward     *TraceForward `json:"forward"`
}

// TraceForward is a plan's forward planned across graphs (goddp.ranks.forward).
type TraceForward struct {
	Graphs       []string `json:"graphs"`
	Aligned      bool     `json:"aligned"`
	Reason       *string  `json:"reason"`
	BucketGraphs []int    `json:"bucket_graphs"`
}

// TraceRecord is one rank's trace record (Trace.to_dict), or as much of it
// as a figure needs.
type TraceRecord struct {
	Rank         int         `json:"rank"`
	Ranks        []int       `json:"ranks"`
	Module       string      `json:"module"`
	CommHook     string      `json:"comm_hook"`
	Plans        []TracePlan `json:"goddp_plans"`
	Steps        []TraceStep `json:"steps"`
	DroppedSteps int         `json:"dropped_steps"`
}

// StepStats are the figures of one step (Note [Trace figures]).
type StepStats struct {
	BackwardS              float64 `json:"backward_s"`
	LastDoneS              float64 `json:"last_done_s"`
	ExposedS               float64 `json:"exposed_s"`
	CommBusyS              float64 `json:"comm_busy_s"`
	Overlapped             float64 `json:"overlapped"`
	Buckets                int     `json:"buckets"`
	LaunchedDuringBackward int     `json:"launched_during_backward"`
	HeadStartS             float64 `json:"head_start_s"`
}

// TraceReport is everything goddp.trace derives from a record: its steps
// normalized, their figures, the median step (-1: no step), the verdict
// and the summary text.
type TraceReport struct {
	Steps      []TraceStep `json:"steps"`
	StepStats  []StepStats `json:"step_stats"`
	MedianStep int         `json:"median_step"`
	Verdict    string      `json:"verdict"`
	Summary    string      `json:"summary"`
}

// AnalyzeTrace normalizes rec's steps and derives the report from them.
func AnalyzeTrace(rec *TraceRecord) *TraceReport {
	r := &TraceReport{Steps: make([]TraceStep, len(rec.Steps)), StepStats: make([]StepStats, len(rec.Steps))}
	for i := range rec.Steps {
		r.Steps[i] = rec.Steps[i].Normalize()
		r.StepStats[i] = r.Steps[i].Stats()
	}
	r.MedianStep = medianStep(r.Steps)
	r.Verdict = r.verdict()
	r.Summary = (&traceText{rec: rec, r: r}).render()
	return r
}

// Normalize gives the step a compute end (the last launch when none was
// seen, and never before it), each bucket a completion (the recorded
// compute end when its future never completed) and its buckets in launch
// order (ties by index).
func (s TraceStep) Normalize() TraceStep {
	lastLaunch := 0.0
	for k, b := range s.Buckets {
		if k == 0 || b.LaunchS > lastLaunch {
			lastLaunch = b.LaunchS
		}
	}
	end := lastLaunch
	if s.ComputeEndS != nil {
		end = *s.ComputeEndS
	}
	out := TraceStep{StartSeen: s.StartSeen, FinalizedS: s.FinalizedS, Buckets: make([]TraceBucket, len(s.Buckets))}
	for k, b := range s.Buckets {
		done := end
		if b.DoneS != nil {
			done = *b.DoneS
		}
		b.DoneS = &done
		if b.ParamNames == nil {
			b.ParamNames = []string{}
		}
		out.Buckets[k] = b
	}
	sort.SliceStable(out.Buckets, func(i, j int) bool {
		a, b := out.Buckets[i], out.Buckets[j]
		return a.LaunchS < b.LaunchS || (a.LaunchS == b.LaunchS && a.Index < b.Index)
	})
	end = max(end, lastLaunch)
	out.ComputeEndS = &end
	return out
}

// computeEnd is a normalized step's compute end (0 if it has none).
func (s *TraceStep) computeEnd() float64 {
	if s.ComputeEndS == nil {
		return 0
	}
	return *s.ComputeEndS
}

// doneAt is a normalized bucket's completion.
func (b *TraceBucket) doneAt() float64 {
	if b.DoneS == nil {
		return 0
	}
	return *b.DoneS
}

// launchedDuring says whether b launched with at least the margin of
// backward left (Note [Trace figures]).
func launchedDuring(b *TraceBucket, end float64) bool {
	return b.LaunchS <= end-DuringBackwardMargin*end
}

// Stats are the figures of a normalized step.
func (s *TraceStep) Stats() StepStats {
	end := s.computeEnd()
	st := StepStats{BackwardS: end, LastDoneS: end, Buckets: len(s.Buckets), Overlapped: 1}
	spans := make([]span, len(s.Buckets))
	var totalBytes int64
	var weighted float64
	for k := range s.Buckets {
		b := &s.Buckets[k]
		if k == 0 || b.doneAt() > st.LastDoneS {
			st.LastDoneS = b.doneAt()
		}
		spans[k] = span{b.LaunchS, b.doneAt()}
		if launchedDuring(b, end) {
			st.LaunchedDuringBackward++
		}
		totalBytes += b.Bytes
		weighted += float64(b.Bytes) * (end - b.LaunchS)
	}
	st.ExposedS = max(0, st.LastDoneS-end)
	busy, before := busyTime(spans, end)
	st.CommBusyS = busy
	if busy > 0 {
		st.Overlapped = before / busy
	}
	if totalBytes != 0 {
		st.HeadStartS = weighted / float64(totalBytes)
	}
	return st
}

// span is one allreduce in flight, from launch to completion.
type span struct{ start, end float64 }

// busyTime is the length of the union of spans, and the part of it that
// lies before end.
func busyTime(spans []span, end float64) (total, before float64) {
	sorted := slices.Clone(spans)
	slices.SortFunc(sorted, func(a, b span) int {
		if a.start != b.start {
			return cmpFloat(a.start, b.start)
		}
		return cmpFloat(a.end, b.end)
	})
	var merged []span
	for _, sp := range sorted {
		if n := len(merged); n > 0 && sp.start <= merged[n-1].end {
			merged[n-1].end = max(merged[n-1].end, sp.end)
		} else {
			merged = append(merged, sp)
		}
	}
	for _, sp := range merged {
		total += sp.end - sp.start
		before += max(0, min(sp.end, end)-sp.start)
	}
	return total, before
}

func cmpFloat(a, b float64) int {
	if a < b {
		return -1
	}
	if a > b {
		return 1
	}
	return 0
}

// medianStep is the index of the step with the median backward time (the
// upper one of two), -1 without steps.
func medianStep(steps []TraceStep) int {
	if len(steps) == 0 {
		return -1
	}
	order := make([]int, len(steps))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(i, j int) bool { return steps[order[i]].computeEnd() < steps[order[j]].computeEnd() })
	return order[len(order)/2]
}

// verdict is one line: the buckets launched during backward in the median
// step, and the median share of communication left exposed.
func (r *TraceReport) verdict() string {
	if r.MedianStep < 0 {
		return "no step with a DDP allreduce was recorded"
	}
	exposed := make([]float64, len(r.StepStats))
	for i, st := range r.StepStats {
		exposed[i] = 1 - st.Overlapped
	}
	slices.Sort(exposed)
	n := len(exposed)
	median := exposed[n/2]
	if n%2 == 0 {
		median = (exposed[n/2-1] + exposed[n/2]) / 2
	}
	st := r.StepStats[r.MedianStep]
	return fmt.Sprintf("%d of %d buckets launched before backward ended; %s of communication exposed",
		st.LaunchedDuringBackward, st.Buckets, percent(median))
}

// percent is a share as a whole percentage.
func percent(x float64) string { return strconv.FormatFloat(x*100, 'f', 0, 64) + "%" }

// traceText renders the summary of one record.
type traceText struct {
	rec   *TraceRecord
	r     *TraceReport
	lines []string
}

func (t *traceText) add(format string, args ...any) {
	t.lines = append(t.lines, fmt.Sprintf(format, args...))
}

func (t *traceText) render() string {
	t.header()
	graphs := t.forward()
	if m := t.r.MedianStep; m >= 0 {
		t.medianTable(m, graphs)
		t.stepTable()
	}
	t.add("verdict: %s", t.r.Verdict)
	return strings.Join(t.lines, "\n")
}

func (t *traceText) header() {
	rec := t.rec
	ranks := rec.Ranks
	if len(ranks) == 0 {
		ranks = []int{rec.Rank}
	}
	t.add("goddp.trace: %s, rank %d of DDP ranks [%s], %d step(s), comm hook: %s",
		rec.Module, rec.Rank, joinInts(ranks, ", "), len(rec.Steps), rec.CommHook)
	if len(rec.Plans) == 0 {
		t.add("goddp plan: none (not compiled by goddp)")
	}
	for _, p := range rec.Plans {
		line := fmt.Sprintf("goddp plan %s: %s piece(s), %d bucket(s), mode %s",
			orNone(p.Fingerprint), intOrNone(p.NumPieces), len(p.BucketBytes), orNone(p.Mode))
		if p.Fallback != nil && *p.Fallback != "" {
			line += ", fallback: " + *p.Fallback
		}
		t.add("%s", line)
	}
}

// forward adds the line naming the graphs of a forward planned together,
// if any, and returns per DDP bucket the graph whose cut closes it (nil
// unless DDP's buckets follow that layout).
func (t *traceText) forward() []int {
	var f *TraceForward
	for _, p := range t.rec.Plans {
		if p.Forward != nil {
			f = p.Forward
			break
		}
	}
	if f == nil {
		return nil
	}
	if !f.Aligned {
		t.add("goddp forward: %d graph(s) planned together, DDP keeps its buckets: %s", len(f.Graphs), orNone(f.Reason))
		return nil
	}
	parts := make([]string, len(f.Graphs))
	for g, text := range f.Graphs {
		parts[g] = fmt.Sprintf("graph %d: %s", g, text)
	}
	t.add("goddp forward: %d graph(s) planned together, DDP's buckets close at the cuts of each "+
		"(column graph: the graph, in forward order, whose piece closes the bucket): %s", len(f.Graphs), strings.Join(parts, "; "))
	if f.BucketGraphs == nil {
		return []int{}
	}
	return f.BucketGraphs
}

// medianTable is the per-bucket table of the median step.
func (t *traceText) medianTable(m int, graphs []int) {
	step := &t.r.Steps[m]
	end := step.computeEnd()
	t.add("median step (%d), times in ms from backward start; backward compute ends at %.1f", t.firstEqual(m), end*1e3)
	if graphs != nil && len(graphs) != len(step.Buckets) {
		graphs = nil // DDP's buckets are not the forward's layout
	}
	column := ""
	if graphs != nil {
		column = fmt.Sprintf(" %5s", "graph")
	}
	t.add("  %6s %11s %6s%s %8s %8s %8s  during backward", "bucket", "bytes", "params", column, "launch", "duration", "done")
	for k := range step.Buckets {
		b := &step.Buckets[k]
		graph := ""
		if graphs != nil {
			graph = fmt.Sprintf(" %5d", graphs[k])
		}
		during := "no"
		if launchedDuring(b, end) {
			during = "yes"
		}
		t.add("  %6d %11s %6d%s %8.1f %8.1f %8.1f  %s", b.Index, sizeText(b.Bytes), b.Params, graph,
			b.LaunchS*1e3, (b.doneAt()-b.LaunchS)*1e3, b.doneAt()*1e3, during)
	}
}

// firstEqual is the first step equal to step m (the record names the
// median step by its first occurrence).
func (t *traceText) firstEqual(m int) int {
	for i := range t.r.Steps {
		if reflect.DeepEqual(t.r.Steps[i], t.r.Steps[m]) {
			return i
		}
	}
	return m
}

// stepTable is the per-step figures.
func (t *traceText) stepTable() {
	t.add("per step (ms):")
	t.add("  %4s %9s %9s %8s %10s %8s", "step", "backward", "last done", "exposed", "overlapped", "buckets")
	for i, st := range t.r.StepStats {
		t.add("  %4d %9.1f %9.1f %8.1f %10s %3d/%-4d", i, st.BackwardS*1e3, st.LastDoneS*1e3, st.ExposedS*1e3,
			percent(st.Overlapped), st.LaunchedDuringBackward, st.Buckets)
	}
	if t.rec.DroppedSteps != 0 {
		t.add("  (%d older step(s) dropped)", t.rec.DroppedSteps)
	}
}

// sizeText is a bucket's size in MiB, or KiB below 128 KiB.
func sizeText(n int64) string {
	if n >= 1<<17 {
		return strconv.FormatFloat(float64(n)/(1<<20), 'f', 2, 64) + " MiB"
	}
	return strconv.FormatFloat(float64(n)/(1<<10), 'f', 1, 64) + " KiB"
}

// intOrNone prints a missing record field as Python's None (as orNone,
// text.go).
func intOrNone(n *int) string {
	if n == nil {
		return "None"
	}
	return strconv.Itoa(*n)
}

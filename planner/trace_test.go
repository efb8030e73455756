package planner

import (
	"encoding/json"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func f64(x float64) *float64 { return &x }

func traceBucket(index int, bytes int64, launch float64, done *float64) TraceBucket {
	return TraceBucket{Index: index, Bytes: bytes, Params: 1, LaunchS: launch, DoneS: done}
}

func TestNormalize(t *testing.T) {
	cases := []struct {
		name       string
		step       TraceStep
		end        float64
		order      []int
		done       []float64
		startSeen  bool
		finalizedS *float64
	}{
		{"launch order, ties by index",
			TraceStep{StartSeen: true, ComputeEndS: f64(1), FinalizedS: f64(1.5), Buckets: []TraceBucket{
				traceBucket(2, 1, 0.5, f64(0.9)), traceBucket(1, 1, 0.5, f64(0.8)), traceBucket(0, 1, 0.1, f64(0.3))}},
			1, []int{0, 1, 2}, []float64{0.3, 0.8, 0.9}, true, f64(1.5)},
		{"no compute end: the last launch",
			TraceStep{Buckets: []TraceBucket{traceBucket(0, 1, 0, f64(0.2)), traceBucket(1, 1, 0.4, nil)}},
			0.4, []int{0, 1}, []float64{0.2, 0.4}, false, nil},
		{"a compute end before the last launch moves to it, an unfinished bucket is done at the recorded end",
			TraceStep{ComputeEndS: f64(0.3), Buckets: []TraceBucket{traceBucket(0, 1, 0.5, nil), traceBucket(1, 1, 0.1, f64(0.2))}},
			0.5, []int{1, 0}, []float64{0.2, 0.3}, false, nil},
	}
	for _, tc := range cases {
		n := tc.step.Normalize()
		assert.Equal(t, tc.end, *n.ComputeEndS, tc.name)
		var order []int
		var done []float64
		for _, b := range n.Buckets {
			order = append(order, b.Index)
			done = append(done, *b.DoneS)
			assert.NotNil(t, b.ParamNames, tc.name)
		}
		assert.Equal(t, tc.order, order, tc.name)
		assert.Equal(t, tc.done, done, tc.name)
		assert.Equal(t, tc.startSeen, n.StartSeen, tc.name)
		assert.Equal(t, tc.finalizedS, n.FinalizedS, tc.name)
		assert.Equal(t, n, n.Normalize(), "%s: normalizing twice changes nothing", tc.name)
	}
}

func TestStepStats(t *testing.T) {
	cases := []struct {
		name string
		step TraceStep
		want StepStats
	}{
		{"overlapping, one late",
			TraceStep{ComputeEndS: f64(1), Buckets: []TraceBucket{
				traceBucket(0, 100, 0.25, f64(0.75)), traceBucket(1, 300, 0.5, f64(1.25)), traceBucket(2, 100, 0.99, f64(1.5))}},
			StepStats{BackwardS: 1, LastDoneS: 1.5, ExposedS: 0.5, CommBusyS: 1.25, Overlapped: 0.75 / 1.25, Buckets: 3,
				LaunchedDuringBackward: 2, HeadStartS: (100*0.75 + 300*0.5 + 100*0.01) / 500}},
		{"a gap between allreduces is not busy",
			TraceStep{ComputeEndS: f64(2), Buckets: []TraceBucket{traceBucket(0, 1, 0, f64(0.5)), traceBucket(1, 1, 1, f64(1.5))}},
			StepStats{BackwardS: 2, LastDoneS: 1.5, ExposedS: 0, CommBusyS: 1, Overlapped: 1, Buckets: 2,
				LaunchedDuringBackward: 2, HeadStartS: 1.5}},
		{"all after backward",
			TraceStep{ComputeEndS: f64(1), Buckets: []TraceBucket{traceBucket(0, 8, 1, f64(3))}},
			StepStats{BackwardS: 1, LastDoneS: 3, ExposedS: 2, CommBusyS: 2, Overlapped: 0, Buckets: 1}},
		{"nothing in flight: fully overlapped, no head start",
			TraceStep{ComputeEndS: f64(1), Buckets: []TraceBucket{traceBucket(0, 0, 0.5, f64(0.5))}},
			StepStats{BackwardS: 1, LastDoneS: 0.5, Overlapped: 1, Buckets: 1, LaunchedDuringBackward: 1}},
		{"exactly at the margin counts as during backward",
			TraceStep{ComputeEndS: f64(1), Buckets: []TraceBucket{traceBucket(0, 4, 0.95, f64(1))}},
			StepStats{BackwardS: 1, LastDoneS: 1, CommBusyS: 0.050000000000000044, Overlapped: 1, Buckets: 1,
				LaunchedDuringBackward: 1, HeadStartS: 0.050000000000000044}},
	}
	for _, tc := range cases {
		n := tc.step.Normalize()
		got := n.Stats()
		assert.InDelta(t, tc.want.HeadStartS, got.HeadStartS, 1e-12, tc.name)
		assert.InDelta(t, tc.want.Overlapped, got.Overlapped, 1e-12, tc.name)
		assert.InDelta(t, tc.want.CommBusyS, got.CommBusyS, 1e-12, tc.name)
		tc.want.HeadStartS, tc.want.Overlapped, tc.want.CommBusyS = got.HeadStartS, got.Overlapped, got.CommBusyS
		assert.Equal(t, tc.want, got, tc.name)
	}
}

func TestMedianAndVerdict(t *testing.T) {
	step := func(end, overlap float64) TraceStep {
		// one bucket in flight from end-overlap to end+(1-overlap): that share before the end
		return TraceStep{ComputeEndS: f64(end), Buckets: []TraceBucket{traceBucket(0, 1, end-overlap, f64(end+1-overlap))}}
	}
	r := AnalyzeTrace(&TraceRecord{})
	assert.Equal(t, -1, r.MedianStep)
	assert.Equal(t, "no step with a DDP allreduce was recorded", r.Verdict)

	r = AnalyzeTrace(&TraceRecord{Steps: []TraceStep{step(3, 0.5), step(1, 0.25), step(2, 1), step(2, 0.75)}})
	assert.Equal(t, 3, r.MedianStep, "the upper of the two middle backward times, equal ones in record order")
	// exposed shares 0.5, 0.75, 0, 0.25: median 0.375, printed half to even
	assert.Equal(t, "1 of 1 buckets launched before backward ended; 38% of communication exposed", r.Verdict)
}

// TestTraceSummaryGolden renders the summary of a two-step record with a
// forward planned across graphs, and of one without steps or plans.
func TestTraceSummaryGolden(t *testing.T) {
	fp, mode, pieces, reason := "00000000000000ab", "ddp", 3, "why"
	rec := &TraceRecord{Rank: 1, Ranks: []int{0, 1}, Module: "GPT", CommHook: "DDP's default allreduce", DroppedSteps: 2,
		Plans: []TracePlan{{Fingerprint: &fp, Mode: &mode, NumPieces: &pieces, BucketBytes: []int64{1, 2},
			Forward: &TraceForward{Graphs: []string{"frame f", "frame g [0/1]"}, Aligned: true, BucketGraphs: []int{1, 0}}}},
		Steps: []TraceStep{
			{StartSeen: true, ComputeEndS: f64(0.012), Buckets: []TraceBucket{
				traceBucket(1, 3<<20, 0.0111, f64(0.02)), traceBucket(0, 1<<16, 0.004, f64(0.006))}},
			{StartSeen: true, ComputeEndS: f64(0.010), Buckets: []TraceBucket{
				traceBucket(0, 1<<16, 0.002, nil), traceBucket(1, 3<<20, 0.009, f64(0.0105))}},
		}}
	text := AnalyzeTrace(rec).Summary + "\n\n"
	unaligned := *rec
	unaligned.Plans = []TracePlan{{Fallback: &reason, Forward: &TraceForward{Graphs: []string{"frame f"}}}}
	text += AnalyzeTrace(&unaligned).Summary + "\n\n"
	text += AnalyzeTrace(&TraceRecord{Module: "Net", CommHook: "hook"}).Summary + "\n"
	checkGolden(t, "trace_summary", text)
}

// TestTraceRecordJSON: the record decodes under the Python names, keys it
// does not read are ignored, and the report encodes under them.
func TestTraceRecordJSON(t *testing.T) {
	var rec TraceRecord
	require.NoError(t, json.Unmarshal([]byte(`{"module": "M", "verdict": "", "steps": [{"compute_end_s": null,
		"buckets": [{"index": 0, "bytes": 8, "params": 1, "launch_s": 0.5, "done_s": null, "extra": 1}]}]}`), &rec))
	out, err := json.Marshal(AnalyzeTrace(&rec))
	require.NoError(t, err)
	var back map[string]any
	require.NoError(t, json.Unmarshal(out, &back))
	step := back["steps"].([]any)[0].(map[string]any)
	assert.Equal(t, 0.5, step["compute_end_s"])
	assert.Equal(t, 0.5, step["buckets"].([]any)[0].(map[string]any)["done_s"])
	assert.Equal(t, []any{}, step["buckets"].([]any)[0].(map[string]any)["param_names"])
	assert.Contains(t, back["step_stats"].([]any)[0], "launched_during_backward")
	assert.EqualValues(t, 0, back["median_step"])
}

// naiveBusy cuts the time line at every interval end and keeps the pieces
// some interval covers: the busy time, and its part before end.
func naiveBusy(spans []span, end float64) (total, before float64) {
	var cuts []float64
	for _, s := range spans {
		cuts = append(cuts, s.start, s.end)
	}
	cuts = append(cuts, end)
	slices.Sort(cuts)
	for i := 0; i+1 < len(cuts); i++ {
		lo, hi := cuts[i], cuts[i+1]
		mid := lo + (hi-lo)/2
		covered := false
		for _, s := range spans {
			if s.start <= mid && mid <= s.end && s.start < s.end {
				covered = true
			}
		}
		if covered && hi > lo {
			total += hi - lo
			if hi <= end {
				before += hi - lo
			}
		}
	}
	return total, before
}

// FuzzTraceFigures checks a step's busy time, overlapped share and exposed
// communication against naiveBusy and a plain maximum, on steps made of up
// to eight buckets with times on a 1/64 s grid (exact in float64).
func FuzzTraceFigures(f *testing.F) {
	f.Add([]byte{16, 20, 40, 30, 50, 60, 70})
	f.Add([]byte{64, 0, 64, 64, 128})
	f.Add([]byte{1, 5, 5, 5, 5})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 1 {
			return
		}
		end := float64(data[0]) / 64
		step := TraceStep{ComputeEndS: f64(end)}
		var spans []span
		lastDone := math.Inf(-1)
		for k := 1; k+1 < len(data) && len(step.Buckets) < 8; k += 2 {
			launch := float64(data[k]) / 64
			done := launch + float64(data[k+1]%128)/64
			step.Buckets = append(step.Buckets, traceBucket(len(step.Buckets), int64(data[k+1]), launch, f64(done)))
			spans = append(spans, span{launch, done})
			lastDone = max(lastDone, done)
		}
		n := step.Normalize()
		st := n.Stats()
		total, before := naiveBusy(spans, *n.ComputeEndS)
		assert.InDelta(t, total, st.CommBusyS, 1e-9, "busy time")
		if total > 0 {
			assert.InDelta(t, before/total, st.Overlapped, 1e-9, "overlapped share")
		} else {
			assert.Equal(t, 1.0, st.Overlapped)
		}
		if len(spans) > 0 {
			assert.Equal(t, max(0, lastDone-*n.ComputeEndS), st.ExposedS, "exposed")
		} else {
			assert.Equal(t, 0.0, st.ExposedS)
		}
		assert.GreaterOrEqual(t, st.Overlapped, 0.0)
		assert.LessOrEqual(t, st.Overlapped, 1.0)
	})
}

package planner

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// traceFacts are facts nothing refuses a trace for, changed by set.
func traceFacts(set func(f *TraceFacts)) *TraceFacts {
	f := &TraceFacts{DDP: &DDPSettings{}, CommHooks: ptr(1)}
	if set != nil {
		set(f)
	}
	return f
}

// traceRules are Note [DDP refusals]'s trace rules in the note's order:
// how to make each apply, and a word of its reason.
var traceRules = []struct {
	name  string
	set   func(f *TraceFacts)
	words string
}{
	{"traced", func(f *TraceFacts) { f.DDP.Traced = true }, "already being traced"},
	{"python reducer", func(f *TraceFacts) { f.DDP.PythonReducer = true }, "Python reducer"},
	{"static graph", func(f *TraceFacts) { f.DDP.StaticGraph = true }, "static_graph=True"},
	{"every allreduce delayed", func(f *TraceFacts) { f.DDP.DelaysEveryAllReduce = true }, "delayed allreduce"},
	{"several hooks", func(f *TraceFacts) { f.CommHooks = ptr(3) }, "DDP lists 3 comm hooks"},
	{"logging data", func(f *TraceFacts) { f.LoggingError = ptr("KeyError: 'x'") }, "logging data (KeyError: 'x')"},
	{"built-in hook", func(f *TraceFacts) { f.DDP.BuiltinCommHook, f.BuiltinCommHookName = true, "ALLREDUCE" }, "(ALLREDUCE)"},
}

// TestTraceRefusals: each rule refuses with its own reason; with every
// later rule's fact too, it is still the reason; an unread comm-hook count
// is reported only where no earlier rule refuses.
func TestTraceRefusals(t *testing.T) {
	for i, rule := range traceRules {
		t.Run(rule.name, func(t *testing.T) {
			r := TraceRefusal(traceFacts(rule.set))
			require.NotNil(t, r.Reason)
			assert.Contains(t, *r.Reason, rule.words)
			assert.Empty(t, r.Unread)
			all := TraceRefusal(traceFacts(func(f *TraceFacts) {
				for _, later := range traceRules[i:] {
					later.set(f)
				}
			}))
			assert.Equal(t, r, all, "first in the note's order")
			unread := TraceRefusal(traceFacts(func(f *TraceFacts) { rule.set(f); f.CommHooks = nil }))
			if i < 4 {
				assert.Equal(t, r, unread, "decided before the hooks are needed")
			} else {
				assert.Equal(t, Refusal{Unread: UnreadCommHooks}, unread)
			}
		})
	}
	t.Run("none", func(t *testing.T) {
		assert.Equal(t, Refusal{}, TraceRefusal(traceFacts(nil)))
		assert.Equal(t, Refusal{}, TraceRefusal(traceFacts(func(f *TraceFacts) { f.CommHooks = ptr(0) })))
	})
	t.Run("alignment facts do not refuse a trace", func(t *testing.T) {
		r := TraceRefusal(traceFacts(func(f *TraceFacts) {
			f.DDP.NoPerBucketCaps, f.DDP.MixedPrecision, f.DDP.DelaysAllReduce, f.DDP.SeveralParamGroups = true, true, true, true
			f.DDP.FindUnusedParameters, f.DDP.JoinEnabled = true, true
		}))
		assert.Equal(t, Refusal{}, r)
	})
}

func TestRebuildRefusal(t *testing.T) {
	assert.Nil(t, RebuildRefusal(&DDPSettings{StaticGraph: true, PythonReducer: true, Traced: true}))
	got := RebuildRefusal(&DDPSettings{JoinEnabled: true})
	require.NotNil(t, got)
	assert.Contains(t, *got, "Join context")
}

// naiveTraceRefusal is Note [DDP refusals] read literally: the rules as a
// list of (applies, reason) pairs, all evaluated, the first applying one
// taken.
func naiveTraceRefusal(f *TraceFacts) Refusal {
	hooks := -1
	if f.CommHooks != nil {
		hooks = *f.CommHooks
	}
	logging := ""
	if f.LoggingError != nil {
		logging = *f.LoggingError
	}
	rules := []struct {
		applies bool
		out     Refusal
	}{
		{f.DDP.Traced, refusedFor("this DDP module is already being traced (one goddp.trace at a time)")},
		{f.DDP.PythonReducer, refusedFor("DDP uses the Python reducer (compiled autograd): it has no comm hooks")},
		{f.DDP.StaticGraph, refusedFor("static_graph=True: a fresh reducer would repeat DDP's static-graph first step")},
		{f.DDP.DelaysEveryAllReduce, refusedFor("every parameter is in DDP's delayed allreduce: DDP reduces nothing in backward")},
		{hooks < 0, Refusal{Unread: UnreadCommHooks}},
		{hooks > 1, refusedFor("DDP lists " + fmt.Sprint(hooks) + " comm hooks; expected at most one")},
		{f.LoggingError != nil, refusedFor("could not read DDP's logging data (" + logging + ")")},
		{f.BuiltinCommHookName != "", refusedFor("a built-in C++ comm hook (" + f.BuiltinCommHookName + ") is registered; it cannot be wrapped " +
			"(register it as a Python hook, e.g. torch.distributed.algorithms.ddp_comm_hooks, to trace it)")},
	}
	for _, r := range rules {
		if r.applies {
			return r.out
		}
	}
	return Refusal{}
}

// TestTraceRefusalMatchesNaive: random facts, the planner's answer equals
// the literal reading of the note.
func TestTraceRefusalMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 2))
	for range 5000 {
		f := &TraceFacts{DDP: &DDPSettings{
			Traced: rng.IntN(4) == 0, PythonReducer: rng.IntN(4) == 0, StaticGraph: rng.IntN(4) == 0,
			DelaysEveryAllReduce: rng.IntN(4) == 0, MixedPrecision: rng.IntN(2) == 0, JoinEnabled: rng.IntN(2) == 0,
		}}
		if rng.IntN(8) != 0 {
			f.CommHooks = ptr(rng.IntN(4))
		}
		if rng.IntN(4) == 0 {
			f.LoggingError = ptr(fmt.Sprintf("E%d: m", rng.IntN(3)))
		}
		if rng.IntN(3) == 0 {
			f.BuiltinCommHookName, f.DDP.BuiltinCommHook = []string{"ALLREDUCE", "FP16_COMPRESS", "a (b)"}[rng.IntN(3)], true
		}
		require.Equal(t, naiveTraceRefusal(f), TraceRefusal(f), "%+v %+v", *f.DDP, f)
	}
}

// TestDDPRefusalWording pins the words users read
// (testdata/ddp_refusals.golden; go test ./planner -run DDPRefusalWording
// -update rewrites it).
func TestDDPRefusalWording(t *testing.T) {
	var b strings.Builder
	for _, rule := range traceRules {
		fmt.Fprintf(&b, "trace, %s: %s\n", rule.name, *TraceRefusal(traceFacts(rule.set)).Reason)
	}
	fmt.Fprintf(&b, "rebuild, join: %s\n", *RebuildRefusal(&DDPSettings{JoinEnabled: true}))
	checkGolden(t, "ddp_refusals", b.String())
}

// FuzzTraceRefusal: any facts, the planner's answer is the note read
// literally (go test ./planner -fuzz FuzzTraceRefusal).
func FuzzTraceRefusal(f *testing.F) {
	f.Add(uint8(0), int8(1), "", "")
	f.Add(uint8(0xff), int8(-1), "E: m", "ALLREDUCE")
	f.Fuzz(func(t *testing.T, bits uint8, hooks int8, logging, builtin string) {
		facts := &TraceFacts{DDP: &DDPSettings{
			Traced: bits&1 != 0, PythonReducer: bits&2 != 0, StaticGraph: bits&4 != 0, DelaysEveryAllReduce: bits&8 != 0,
			BuiltinCommHook: builtin != "",
		}, BuiltinCommHookName: builtin}
		if hooks >= 0 {
			facts.CommHooks = ptr(int(hooks))
		}
		if bits&16 != 0 {
			facts.LoggingError = &logging
		}
		require.Equal(t, naiveTraceRefusal(facts), TraceRefusal(facts))
	})
}

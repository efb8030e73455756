package planner

import "fmt"

// Note [DDP refusals]: besides alignment (Note [Alignment refusals]), goddp
// changes a DDP module in two more ways, each refused from facts the shim
// reads off the module and hands over as the same goddp_ddp flags (with the
// few facts flags cannot carry beside them); the planner picks the reason
// and words it.
//   - goddp.trace wraps DDP's comm hook in a fresh reducer. It is refused,
//     first that applies: a trace is already installed on the module; DDP
//     runs its Python reducer (no comm hooks to wrap); static_graph is set
//     (a fresh reducer would repeat the static-graph first step); every
//     parameter is in DDP's delayed allreduce (nothing reduced in
//     backward); DDP lists several comm hooks; DDP's logging data, which
//     names a built-in hook, cannot be read; a built-in (C++) comm hook is
//     registered (it cannot be wrapped). A fact the shim could not read is
//     reported back as unread where a rule needs it, and the shim raises
//     the error it kept, as reading it in place would have.
//   - The reducer rebuild that installs aligned buckets is refused at the
//     first training call when that step runs inside a Join context (DDP
//     has just handed the old reducer this step's Join state, which cannot
//     be read back).

// TraceFacts are what Note [DDP refusals] refuses a trace from.
type TraceFacts struct {
	// DDP carries the flags: Traced, PythonReducer, StaticGraph,
	// DelaysEveryAllReduce, and BuiltinCommHook (set iff
	// BuiltinCommHookName is not empty).
	DDP *DDPSettings
	// CommHooks is how many Python comm hooks DDP lists; nil when they
	// could not be read.
	CommHooks *int
	// BuiltinCommHookName names the built-in hook; "" for none.
	BuiltinCommHookName string
	// LoggingError is why DDP's logging data could not be read ("Type:
	// message"); nil when it could.
	LoggingError *string
}

// Refusal is a reason, or the fact a rule needed that the shim could not
// read (Unread; Reason is then nil).
type Refusal struct {
	Reason *string
	Unread string
}

// UnreadCommHooks is Refusal.Unread for TraceFacts.CommHooks.
const UnreadCommHooks = "comm_hooks"

// TraceRefusal is the first reason of Note [DDP refusals] that refuses a
// trace, or a zero Refusal when none does.
func TraceRefusal(f *TraceFacts) Refusal {
	d := f.DDP
	switch {
	case d.Traced:
		return refusedFor("this DDP module is already being traced (one goddp.trace at a time)")
	case d.PythonReducer:
		return refusedFor("DDP uses the Python reducer (compiled autograd): it has no comm hooks")
	case d.StaticGraph:
		return refusedFor("static_graph=True: a fresh reducer would repeat DDP's static-graph first step")
	case d.DelaysEveryAllReduce:
		return refusedFor("every parameter is in DDP's delayed allreduce: DDP reduces nothing in backward")
	case f.CommHooks == nil:
		return Refusal{Unread: UnreadCommHooks}
	case *f.CommHooks > 1:
		return refusedFor(fmt.Sprintf("DDP lists %d comm hooks; expected at most one", *f.CommHooks))
	case f.LoggingError != nil:
		return refusedFor(fmt.Sprintf("could not read DDP's logging data (%s)", *f.LoggingError))
	case f.BuiltinCommHookName != "":
		return refusedFor(fmt.Sprintf("a built-in C++ comm hook (%s) is registered; it cannot be wrapped "+
			"(register it as a Python hook, e.g. torch.distributed.algorithms.ddp_comm_hooks, to trace it)", f.BuiltinCommHookName))
	}
	return Refusal{}
}

// RebuildRefusal is why DDP's reducer cannot be rebuilt at this first
// training call (Note [DDP refusals]), or nil. A module that trained before
// can still be rebuilt (Note [Agreeing on DDP's layout] in
// python/goddp/ranks/agreement.py).
func RebuildRefusal(d *DDPSettings) *string {
	if d.JoinEnabled {
		return ptr("the first training step runs inside a Join context, whose state lives in DDP's reducer")
	}
	return nil
}

func refusedFor(reason string) Refusal { return Refusal{Reason: &reason} }

package planner

import (
	"fmt"
	"strconv"
	"strings"
)

// Note [Rounds that did not settle]
//
// Two agreements meet in rounds of goddp.ranks.store_round: the plan check
// at a DDP module's first training call (and its install round) and
// goddp.trace (entering and leaving). A round that does not end in "go"
// becomes one error text, decided here from the round's facts: either this
// rank waited for ranks that never arrived, or it came after the others
// had given up on it (then it stops too, or, where the meeting lets the
// ranks keep DDP's own buckets, Note [A round given up], it keeps them),
// or, for the trace, some rank refused. Each meeting names where the ranks
// were to meet and the rule every rank must follow; the shim only raises
// or logs the text.

// Meeting is where the ranks of a round were to meet.
type Meeting string

const (
	MeetFirstStep  Meeting = "first step" // the plan check at a DDP module's first training call
	MeetInstall    Meeting = "install"    // the plan check's install round
	MeetTraceEnter Meeting = "enter"      // entering goddp.trace
	MeetTraceLeave Meeting = "leave"      // leaving goddp.trace
)

// RoundGroup is the process group of a round as the shim's
// goddp.ranks.group.Group states it.
type RoundGroup struct {
	Name     string
	Ranks    []int
	Rank     int
	TimeoutS float64
}

// RoundRequest is how a round ended for this rank
// (goddp.ranks.store_round.Round) and where it was.
type RoundRequest struct {
	Meeting Meeting
	// Keeps: a rank of the first-step meeting keeps DDP's own buckets and
	// trains on rather than stop (Note [A round given up]).
	Keeps bool
	// TimeoutEnv names the environment variable of the plan check's wait.
	TimeoutEnv string
	Group      RoundGroup
	Outcome    string
	GaveUp     bool
	Complete   bool
	WaitedS    float64
	Statements map[int]string // what each rank said (only those seen)
}

// RoundError is the error text of a round that did not end in "go"; nil
// when it did.
func RoundError(req *RoundRequest) (*string, error) {
	who, event, rule, late, err := req.words()
	if err != nil {
		return nil, err
	}
	g := &req.Group
	switch {
	case req.GaveUp && req.Complete:
		return ptr(fmt.Sprintf("%s: rank %d reached %s of %s after the others had stopped waiting for it (%s), %s s after the first arrival; %s. %s",
			who, g.Rank, event, g.where(), req.Outcome, pyG(g.TimeoutS), late, rule)), nil
	case req.GaveUp:
		return ptr(fmt.Sprintf("%s: rank %d waited %s s at %s of %s for rank(s) %s, which never arrived. %s",
			who, g.Rank, pyF0(req.WaitedS), event, g.where(), req.missing(), rule)), nil
	case req.Outcome == "go":
		return nil, nil
	case req.Meeting == MeetTraceEnter || req.Meeting == MeetTraceLeave:
		var reasons []string
		for _, r := range sortedKeys(req.Statements) {
			if v := req.Statements[r]; v != "ok" {
				reasons = append(reasons, fmt.Sprintf("rank %d: %s", r, v))
			}
		}
		return ptr(fmt.Sprintf("goddp.trace: cannot %s the trace (%s)", req.Meeting, strings.Join(reasons, "; "))), nil
	}
	return nil, errorf(ErrInvalidConfig, "planner: RoundError: the %s round ended in %q, which only a round given up may", req.Meeting, req.Outcome)
}

// words are the meeting's words: who speaks, where the ranks were to
// meet, the rule every rank follows and what a late rank does.
func (req *RoundRequest) words() (who, event, rule, late string, err error) {
	late = "it stops too rather than go on alone"
	switch req.Meeting {
	case MeetFirstStep, MeetInstall:
		if req.TimeoutEnv == "" {
			return "", "", "", "", errorf(ErrInvalidConfig, "planner: RoundError: the %s round needs the name of its timeout's variable", req.Meeting)
		}
		who, event = "goddp", "the first training step"
		if req.Meeting == MeetInstall {
			event = "installing DDP's new buckets"
		}
		rule = fmt.Sprintf("Every rank of a DDP module must run its first training step within %s s of the first; "+
			"a rank that crashed, or one still compiling then, stops here (raise the limit with %s=<seconds> or the "+
			"process group's timeout).", pyF0(req.Group.TimeoutS), req.TimeoutEnv)
		if req.Keeps {
			if req.Meeting != MeetFirstStep {
				return "", "", "", "", errorf(ErrInvalidConfig, "planner: RoundError: only the first-step round keeps DDP's buckets")
			}
			rule = fmt.Sprintf("Every rank keeps DDP's own buckets and trains on (Note [A round given up] in goddp.ranks.verdict); "+
				"%s=<seconds> sets how long the ranks wait for each other here.", req.TimeoutEnv)
			late = "it keeps DDP's own buckets, as they do"
		}
	case MeetTraceEnter, MeetTraceLeave:
		if req.Keeps {
			return "", "", "", "", errorf(ErrInvalidConfig, "planner: RoundError: only the first-step round keeps DDP's buckets")
		}
		who, event = "goddp.trace", "entering the trace"
		if req.Meeting == MeetTraceLeave {
			event = "leaving the trace"
		}
		rule = fmt.Sprintf("Every rank must %s it at the same step", req.Meeting)
	default:
		return "", "", "", "", errorf(ErrInvalidConfig, "planner: RoundError: meeting %q; want %q, %q, %q or %q",
			string(req.Meeting), MeetFirstStep, MeetInstall, MeetTraceEnter, MeetTraceLeave)
	}
	return who, event, rule, late, nil
}

// where names the group as the messages do.
func (g *RoundGroup) where() string {
	return fmt.Sprintf("a DDP module (process group %s, ranks %s)", pyRepr(g.Name), pyIntList(g.Ranks))
}

// missing are the group's ranks this rank never heard from, in the
// group's order.
func (req *RoundRequest) missing() string {
	var out []int
	for _, r := range req.Group.Ranks {
		if _, ok := req.Statements[r]; !ok {
			out = append(out, r)
		}
	}
	return pyIntList(out)
}

func pyIntList(xs []int) string {
	ys := make([]int64, len(xs))
	for i, x := range xs {
		ys[i] = int64(x)
	}
	return intList(ys)
}

// pyG writes x as Python's format(x, "g") does, for a finite x.
func pyG(x float64) string {
	return strconv.FormatFloat(x, 'g', 6, 64)
}

// pyF0 writes x as Python's format(x, ".0f") does, for a finite x.
func pyF0(x float64) string {
	return strconv.FormatFloat(x, 'f', 0, 64)
}

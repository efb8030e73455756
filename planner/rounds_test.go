package planner

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func roundReq(meeting Meeting, keeps bool, outcome string, gaveUp, complete bool, said map[int]string) *RoundRequest {
	return &RoundRequest{Meeting: meeting, Keeps: keeps, TimeoutEnv: "GODDP_PLAN_CHECK_TIMEOUT",
		Group:   RoundGroup{Name: "0", Ranks: []int{0, 1, 2}, Rank: 1, TimeoutS: 1800},
		Outcome: outcome, GaveUp: gaveUp, Complete: complete, WaitedS: 1799.6, Statements: said}
}

// TestRoundError: which text each way a round ends gets.
func TestRoundError(t *testing.T) {
	seen := map[int]string{1: "ok"}
	for _, tc := range []struct {
		name string
		req  *RoundRequest
		want string // "" for none
	}{
		{"go", roundReq(MeetFirstStep, false, "go", false, true, seen), ""},
		{"trace go", roundReq(MeetTraceLeave, false, "go", false, true, seen), ""},
		{"waited", roundReq(MeetFirstStep, false, "gave up: rank 1", true, false, seen),
			"goddp: rank 1 waited 1800 s at the first training step of a DDP module (process group '0', ranks [0, 1, 2]) for rank(s) [0, 2], which never arrived. " +
				"Every rank of a DDP module must run its first training step within 1800 s of the first; a rank that crashed, or one still compiling then, " +
				"stops here (raise the limit with GODDP_PLAN_CHECK_TIMEOUT=<seconds> or the process group's timeout)."},
		{"late, keeps", roundReq(MeetFirstStep, true, "gave up: rank 0", true, true, seen),
			"goddp: rank 1 reached the first training step of a DDP module (process group '0', ranks [0, 1, 2]) after the others had stopped waiting for it " +
				"(gave up: rank 0), 1800 s after the first arrival; it keeps DDP's own buckets, as they do. Every rank keeps DDP's own buckets and trains on " +
				"(Note [A round given up] in planner/agree.go); GODDP_PLAN_CHECK_TIMEOUT=<seconds> sets how long the ranks wait for each other here."},
		{"install, late", roundReq(MeetInstall, false, "gave up: rank 0", true, true, seen),
			"goddp: rank 1 reached installing DDP's new buckets of a DDP module (process group '0', ranks [0, 1, 2]) after the others had stopped waiting for it " +
				"(gave up: rank 0), 1800 s after the first arrival; it stops too rather than go on alone. Every rank of a DDP module must run its first training " +
				"step within 1800 s of the first; a rank that crashed, or one still compiling then, stops here (raise the limit with GODDP_PLAN_CHECK_TIMEOUT=<seconds> " +
				"or the process group's timeout)."},
		{"trace refused", roundReq(MeetTraceEnter, false, "refused", false, true, map[int]string{2: "no", 0: "ok", 1: "a forward ran"}),
			"goddp.trace: cannot enter the trace (rank 1: a forward ran; rank 2: no)"},
		{"trace waited", roundReq(MeetTraceLeave, false, "gave up: rank 1", true, false, map[int]string{}),
			"goddp.trace: rank 1 waited 1800 s at leaving the trace of a DDP module (process group '0', ranks [0, 1, 2]) for rank(s) [0, 1, 2], which never arrived. " +
				"Every rank must leave it at the same step"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RoundError(tc.req)
			require.NoError(t, err)
			if tc.want == "" {
				assert.Nil(t, got)
				return
			}
			require.NotNil(t, got)
			assert.Equal(t, tc.want, *got)
		})
	}
}

// TestRoundErrorRejects: unknown meetings, "keeps" outside the first
// step, and a plan-check round refused without being given up.
func TestRoundErrorRejects(t *testing.T) {
	for _, tc := range []struct {
		req  *RoundRequest
		want string
	}{
		{roundReq("lunch", false, "go", false, true, nil), `meeting "lunch"`},
		{roundReq(MeetInstall, true, "gave up: rank 0", true, true, nil), "only the first-step round keeps"},
		{roundReq(MeetTraceEnter, true, "go", false, true, nil), "only the first-step round keeps"},
		{roundReq(MeetFirstStep, false, "refused", false, true, nil), `ended in "refused"`},
		{&RoundRequest{Meeting: MeetInstall, Outcome: "go"}, "needs the name of its timeout's variable"},
	} {
		_, err := RoundError(tc.req)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
		assert.Equal(t, ErrInvalidConfig, err.(*Error).Code)
	}
}

// TestPythonNumbers: pyG and pyF0 write numbers as Python's "g" and ".0f"
// formats do (values printed by CPython 3.11).
func TestPythonNumbers(t *testing.T) {
	for x, want := range map[float64][2]string{
		1800: {"1800", "1800"}, 0.5: {"0.5", "0"}, 2.5: {"2.5", "2"}, 1.5: {"1.5", "2"}, 1e-05: {"1e-05", "0"},
		1e6: {"1e+06", "1000000"}, 123456.789: {"123457", "123457"}, 1234567: {"1.23457e+06", "1234567"}, 1e16: {"1e+16", "10000000000000000"},
		0.0001: {"0.0001", "0"}, 100000: {"100000", "100000"},
	} {
		assert.Equal(t, want, [2]string{pyG(x), pyF0(x)}, "%v", x)
	}
}

// TestRoundWords pins the texts users read (testdata/round_words.golden;
// go test ./planner -run RoundWords -update rewrites it).
func TestRoundWords(t *testing.T) {
	var b strings.Builder
	for _, m := range []Meeting{MeetFirstStep, MeetInstall, MeetTraceEnter, MeetTraceLeave} {
		for _, keeps := range []bool{false, true} {
			if keeps && m != MeetFirstStep {
				continue
			}
			for _, end := range []struct {
				name     string
				outcome  string
				gaveUp   bool
				complete bool
			}{{"waited", "gave up: rank 1", true, false}, {"late", "gave up: rank 0", true, true}, {"refused", "refused", false, true}} {
				if end.name == "refused" && (m == MeetFirstStep || m == MeetInstall) {
					continue
				}
				req := roundReq(m, keeps, end.outcome, end.gaveUp, end.complete, map[int]string{1: "ok", 2: "not traced here"})
				req.Group = RoundGroup{Name: "it's", Ranks: []int{0, 1, 2}, Rank: 1, TimeoutS: 12.5}
				req.WaitedS = 12.5
				got, err := RoundError(req)
				require.NoError(t, err)
				fmt.Fprintf(&b, "== %s keeps=%v %s\n%s\n", m, keeps, end.name, *got)
			}
		}
	}
	checkGolden(t, "round_words", b.String())
}

// naiveMissing is the ranks of the group not among the statements, the
// obvious way: sort a copy of the group's ranks by position and keep those
// no statement names.
func naiveMissing(ranks []int, said map[int]string) []int {
	out := []int{}
	for i := 0; i < len(ranks); i++ {
		found := false
		for r := range said {
			found = found || r == ranks[i]
		}
		if !found {
			out = append(out, ranks[i])
		}
	}
	return out
}

// FuzzRoundError: a round given up names exactly the missing ranks (and
// a refused trace round exactly the ranks that did not say "ok", by rank),
// and whatever the facts, RoundError never panics.
func FuzzRoundError(f *testing.F) {
	f.Add(uint64(1), uint8(3), uint8(1), false)
	f.Add(uint64(7), uint8(1), uint8(0), true)
	f.Fuzz(func(t *testing.T, seed uint64, n, pick uint8, complete bool) {
		rng := rand.New(rand.NewPCG(seed, 3))
		size := int(n%8) + 1
		ranks := rng.Perm(16)[:size]
		slices.Sort(ranks)
		said := map[int]string{}
		for _, r := range ranks {
			if rng.IntN(2) == 0 {
				said[r] = []string{"ok", "no", "x; y"}[rng.IntN(3)]
			}
		}
		meetings := []Meeting{MeetFirstStep, MeetInstall, MeetTraceEnter, MeetTraceLeave}
		m := meetings[int(pick)%len(meetings)]
		req := &RoundRequest{Meeting: m, TimeoutEnv: "E", Group: RoundGroup{Name: "g", Ranks: ranks, Rank: ranks[0], TimeoutS: rng.Float64() * 100},
			Outcome: "gave up: rank 0", GaveUp: true, Complete: complete, WaitedS: rng.Float64() * 100, Statements: said}
		got, err := RoundError(req)
		require.NoError(t, err)
		if !complete {
			assert.Contains(t, *got, fmt.Sprintf("for rank(s) %s, which never arrived", pyIntList(naiveMissing(ranks, said))))
		} else {
			assert.Contains(t, *got, "after the others had stopped waiting for it (gave up: rank 0)")
		}
		if m == MeetTraceEnter || m == MeetTraceLeave {
			req.Outcome, req.GaveUp = "refused", false
			got, err = RoundError(req)
			require.NoError(t, err)
			var want []string
			keys := make([]int, 0, len(said))
			for r := range said {
				keys = append(keys, r)
			}
			sort.Ints(keys)
			for _, r := range keys {
				if said[r] != "ok" {
					want = append(want, fmt.Sprintf("rank %d: %s", r, said[r]))
				}
			}
			assert.Equal(t, fmt.Sprintf("goddp.trace: cannot %s the trace (%s)", m, strings.Join(want, "; ")), *got)
		}
	})
}

package planner

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const agreeBuild = "goddp test abi 0"

func agreeLayout(caps []int64, buckets ...[]int32) *Layout {
	l := &Layout{Caps: caps, Order: OrderReady, Build: agreeBuild}
	for _, b := range buckets {
		l.Buckets = append(l.Buckets, LayoutBucket{Positions: b})
	}
	return l
}

var (
	agreeCaps = []int64{4096, 8192, 1024}
	// agreeA and agreeB differ in where parameters 5 and 3 go.
	agreeA = agreeLayout(agreeCaps, []int32{5, 4}, []int32{3, 2}, []int32{1, 0})
	agreeB = agreeLayout(agreeCaps, []int32{3, 4}, []int32{5, 2}, []int32{1, 0})
)

// proposes is a rank that proposes l, with its real digest.
func proposes(t testing.TB, rank int, l *Layout) Statement {
	d, err := LayoutDigest(l)
	require.NoError(t, err)
	return Statement{Rank: rank, Layout: l, Digest: &d, Fingerprint: ptr(uint64(0xabc)), Pieces: 3}
}

func keeps(rank int, reason string) Statement {
	return Statement{Rank: rank, Reason: &reason, Fingerprint: ptr(uint64(0xabc)), Pieces: 3}
}

func agreeNames() map[int32]string {
	names := map[int32]string{}
	for p := range int32(6) {
		names[p] = fmt.Sprintf("layers.%d.weight", p)
	}
	return names
}

func agree(t testing.TB, mayDefer bool, st ...Statement) *Verdict {
	v, err := Agree(&AgreeRequest{Statements: st, Names: agreeNames(), MayDefer: mayDefer})
	require.NoError(t, err)
	return v
}

func strict(s Statement) Statement { s.Strict = true; return s }
func later(s Statement) Statement  { s.Layout, s.Digest, s.Later = nil, nil, true; return s }
func lost(s Statement, why string) Statement {
	s.Layout, s.Digest, s.Lost = nil, nil, &why
	return s
}

// TestAgreeVerdicts covers every branch of Note [The agreement verdict].
func TestAgreeVerdicts(t *testing.T) {
	failed := keeps(1, "fallback: planning failed")
	failed.Fingerprint = nil
	otherPlan := proposes(t, 0, agreeA)
	otherPlan.Fingerprint = ptr(uint64(0xabd))
	for _, tc := range []struct {
		name      string
		mayDefer  bool
		st        []Statement
		err       AgreeError
		action    Action
		layout    int // rank, -1 none
		disagreed bool
		reason    string // prefix; "-" for nil
	}{
		{"same layout everywhere installs", true, []Statement{proposes(t, 0, agreeA), proposes(t, 1, agreeA), proposes(t, 2, agreeA)}, ErrorNone, ActionInstall, 0, false, "-"},
		{"plans that differ with one layout install", true, []Statement{otherPlan, proposes(t, 1, agreeA)}, ErrorNone, ActionInstall, 0, false, "-"},
		{"one rank alone installs", false, []Statement{proposes(t, 4, agreeA)}, ErrorNone, ActionInstall, 4, false, "-"},
		{"strict alone is no error when layouts agree", true, []Statement{strict(proposes(t, 0, agreeA)), strict(proposes(t, 1, agreeA))}, ErrorNone, ActionInstall, 0, false, "-"},
		{"a lost reducer stops everyone", true, []Statement{proposes(t, 0, agreeA), lost(proposes(t, 1, agreeA), "injected")}, ErrorPeerFailed, 0, -1, false, ""},
		{"a lost reducer beats strict and later", true, []Statement{strict(proposes(t, 0, agreeA)), later(proposes(t, 1, agreeA)), lost(proposes(t, 2, agreeB), "x")}, ErrorPeerFailed, 0, -1, false, ""},
		{"strict differing layouts raise", true, []Statement{proposes(t, 0, agreeA), strict(proposes(t, 1, agreeA)), proposes(t, 2, agreeB)}, ErrorPlanMismatch, 0, -1, false, ""},
		{"strict mismatch beats later", true, []Statement{strict(proposes(t, 0, agreeA)), proposes(t, 1, agreeB), later(proposes(t, 2, agreeA))}, ErrorPlanMismatch, 0, -1, false, ""},
		{"later defers", true, []Statement{proposes(t, 0, agreeA), later(proposes(t, 1, agreeA))}, ErrorNone, ActionLater, -1, false, "some rank will propose"},
		{"later with differing layouts still defers", true, []Statement{proposes(t, 0, agreeA), proposes(t, 1, agreeB), later(proposes(t, 2, agreeA))}, ErrorNone, ActionLater, -1, false, "some rank will propose"},
		{"later at the deferred round keeps", false, []Statement{proposes(t, 0, agreeA), later(proposes(t, 1, agreeA))}, ErrorNone, ActionKeep, -1, true, "the ranks did not all propose the same layout: rank 0: plan"},
		{"differing layouts keep, naming them", true, []Statement{proposes(t, 0, agreeA), proposes(t, 1, agreeB)}, ErrorNone, ActionKeep, -1, true, "the ranks' layouts differ: bucket 0: rank 1 holds [layers.3.weight]"},
		{"one fallback keeps and lists everyone", true, []Statement{proposes(t, 0, agreeA), keeps(1, "fallback: x"), proposes(t, 2, agreeA)}, ErrorNone, ActionKeep, -1, true, "the ranks did not all propose the same layout: rank 0: plan 0000000000000abc, 3 pieces; proposes DDP buckets [4096, 8192, 1024] bytes (layout "},
		{"the same no everywhere is no disagreement", true, []Statement{keeps(0, "align_buckets=False"), keeps(1, "align_buckets=False")}, ErrorNone, ActionKeep, -1, false, "align_buckets=False"},
		{"the same no without words", true, []Statement{{Rank: 0, Pieces: 1}, {Rank: 1, Pieces: 1}}, ErrorNone, ActionKeep, -1, false, "-"},
		{"a failed plan is no mismatch", true, []Statement{proposes(t, 0, agreeA), failed}, ErrorNone, ActionKeep, -1, true, "the ranks did not all propose"},
		{"the same reason, one plan failed, disagrees", true, []Statement{keeps(0, "fallback: planning failed"), failed}, ErrorNone, ActionKeep, -1, true, "the ranks did not all propose"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := agree(t, tc.mayDefer, tc.st...)
			require.Equal(t, tc.err, v.Error, v.Message)
			if tc.err != ErrorNone {
				assert.NotEmpty(t, v.Message)
				return
			}
			assert.Equal(t, tc.action, v.Action)
			assert.Equal(t, tc.layout, v.LayoutRank)
			assert.Equal(t, tc.disagreed, v.Disagreed)
			if tc.reason == "-" {
				assert.Nil(t, v.Reason)
			} else {
				require.NotNil(t, v.Reason)
				assert.True(t, strings.HasPrefix(*v.Reason, tc.reason), *v.Reason)
			}
			assert.Equal(t, tc.action == ActionInstall, v.Record.Aligned)
			assert.Equal(t, tc.action, v.Record.Action)
			assert.Len(t, v.Record.Ranks, len(tc.st))
			if tc.action == ActionInstall {
				assert.Equal(t, agreeCaps, v.Record.Caps)
				assert.NotNil(t, v.Record.LayoutDigest)
			} else {
				assert.Nil(t, v.Record.Caps)
				assert.Nil(t, v.Record.LayoutDigest)
			}
		})
	}
}

func TestAgreeInstallRound(t *testing.T) {
	st := []Statement{proposes(t, 0, agreeA), proposes(t, 1, agreeA)}
	round := func(installed map[int]InstallReport) (*Verdict, error) {
		return Agree(&AgreeRequest{Statements: st, Installed: installed})
	}
	v, err := round(map[int]InstallReport{0: {}, 1: {}})
	require.NoError(t, err)
	assert.Equal(t, ActionInstall, v.Action)
	assert.Equal(t, 0, v.LayoutRank)

	v, err = round(map[int]InstallReport{1: {Failed: "no per-bucket caps"}, 0: {Failed: "boom"}})
	require.NoError(t, err)
	assert.Equal(t, ActionKeep, v.Action)
	assert.True(t, v.Disagreed)
	assert.Equal(t, "the ranks agreed, but rank 0: boom; rank 1: no per-bucket caps", *v.Reason)
	assert.False(t, v.Record.Aligned)
	assert.Nil(t, v.Record.Caps)

	v, err = round(map[int]InstallReport{0: {Failed: "boom"}, 1: {Lost: "gone"}})
	require.NoError(t, err)
	assert.Equal(t, ErrorPeerFailed, v.Error)
	assert.Equal(t, "goddp: DDP's reducer could not be rebuilt on rank 1 (gone); every rank stops rather than train without gradient allreduces", v.Message)

	st = []Statement{proposes(t, 0, agreeA), proposes(t, 1, agreeB)}
	_, err = round(map[int]InstallReport{0: {}, 1: {}})
	var perr *Error
	require.True(t, errors.As(err, &perr), "%v", err)
	assert.Equal(t, ErrInvalidConfig, perr.Code)
}

// TestAgreeRefusesMalformedRounds: statements no rank of goddp could have
// made are ErrInvalidConfig, never a verdict (Agree is the one validator).
func TestAgreeRefusesMalformedRounds(t *testing.T) {
	good := func(rank int) Statement { return proposes(t, rank, agreeA) }
	withDigest := func(s Statement, d uint64) Statement { s.Digest = &d; return s }
	noLayout := func(s Statement) Statement { s.Layout = nil; return s }
	noDigest := func(s Statement) Statement { s.Digest = nil; return s }
	aDigest, err := LayoutDigest(agreeA)
	require.NoError(t, err)
	otherCaps := agreeLayout([]int64{1, 2, 3}, []int32{5, 4}, []int32{3, 2}, []int32{1, 0})
	badCaps := agreeLayout([]int64{-5, 3, 1}, []int32{5, 4}, []int32{3, 2}, []int32{1, 0})
	twoRanks := []Statement{good(0), good(1)}
	for _, tc := range []struct {
		name      string
		st        []Statement
		names     map[int32]string
		installed map[int]InstallReport
		want      string
	}{
		{"no statement", nil, nil, nil, "at least one statement"},
		{"a repeated rank", []Statement{keeps(1, "a"), keeps(1, "a")}, nil, nil, "rank 1 made two statements"},
		{"a negative rank", []Statement{good(-1), good(1)}, nil, nil, "rank -1"},
		{"the lowest rank negative", []Statement{good(math.MinInt), good(0)}, nil, nil, "is not a rank"},
		{"a digest without a layout everywhere", []Statement{noLayout(good(0)), noLayout(good(1))}, nil, nil, "rank 0 gave a layout digest without a layout"},
		{"a layout without a digest", []Statement{good(0), noDigest(good(1))}, nil, nil, "rank 1 gave a layout without its digest"},
		{"a negative piece count", []Statement{good(0), func() Statement { s := keeps(1, "a"); s.Pieces = -2; return s }()}, nil, nil, "rank 1 runs -2 pieces"},
		{"a digest that is not the layout's", []Statement{good(0), withDigest(proposes(t, 1, otherCaps), aDigest)}, nil, nil, "rank 1 gave layout digest"},
		{"a digest off by one", []Statement{withDigest(good(0), aDigest+1)}, nil, nil, "rank 0 gave layout digest"},
		{"a layout no DDP module could have", []Statement{withDigest(proposes(t, 0, agreeA), aDigest), {Rank: 1, Layout: badCaps, Digest: &aDigest}}, nil, nil, "rank 1"},
		{"a negative position's name", twoRanks, map[int32]string{-1: "w"}, nil, "DDP position -1"},
		{"an install report from a rank without a statement", twoRanks, nil, map[int]InstallReport{0: {}, 1: {}, 7: {Failed: "x"}}, "rank 7"},
		{"an install report missing", twoRanks, nil, map[int]InstallReport{0: {}}, "rank 1"},
		{"no install report at all", twoRanks, nil, map[int]InstallReport{}, "rank 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Agree(&AgreeRequest{Statements: tc.st, Names: tc.names, Installed: tc.installed, MayDefer: true})
			var perr *Error
			require.True(t, errors.As(err, &perr), "no error; verdict %+v", v)
			assert.Equal(t, ErrInvalidConfig, perr.Code)
			assert.Contains(t, perr.Error(), tc.want)
			assert.Nil(t, v)
		})
	}
}

// TestAgreeSortsExtremeRanks: ranks far apart still sort in rank order
// (a comparator that subtracts would overflow).
func TestAgreeSortsExtremeRanks(t *testing.T) {
	v := agree(t, true, proposes(t, math.MaxInt, agreeA), proposes(t, 0, agreeA), proposes(t, math.MaxInt-1, agreeA), proposes(t, 5, agreeA))
	var ranks []int
	for _, r := range v.Record.Ranks {
		ranks = append(ranks, r.Rank)
	}
	assert.Equal(t, []int{0, 5, math.MaxInt - 1, math.MaxInt}, ranks)
	assert.Equal(t, 0, v.LayoutRank)
}

// TestAgreeIgnoresTheOrderOfStatements: every rank hands the statements in
// whatever order they came; the verdict must not depend on it.
func TestAgreeIgnoresTheOrderOfStatements(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	for range 200 {
		st := randomStatements(rng)
		want, werr := Agree(&AgreeRequest{Statements: st, Names: agreeNames(), MayDefer: true})
		for range 5 {
			shuffled := slices.Clone(st)
			rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			got, gerr := Agree(&AgreeRequest{Statements: shuffled, Names: agreeNames(), MayDefer: true})
			require.Equal(t, werr, gerr)
			require.Equal(t, want, got)
		}
	}
}

// TestAgreeIsTheSameInAnotherProcess: the wording, rendered by a fresh run
// of this test binary (other map seeds, other allocation), is byte for byte
// the one this process renders.
func TestAgreeIsTheSameInAnotherProcess(t *testing.T) {
	if path := os.Getenv("GODDP_AGREE_WORDING_OUT"); path != "" {
		require.NoError(t, os.WriteFile(path, []byte(renderAgreeWording(t)), 0o644))
		return
	}
	self, err := os.Executable()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "wording")
	cmd := exec.Command(self, "-test.run=^TestAgreeIsTheSameInAnotherProcess$")
	cmd.Env = append(os.Environ(), "GODDP_AGREE_WORDING_OUT="+path)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	theirs, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, renderAgreeWording(t), string(theirs))
}

// TestAgreeWording pins the words users read (testdata/agree_wording.golden;
// go test ./planner -run AgreeWording -update rewrites it).
func TestAgreeWording(t *testing.T) {
	checkGolden(t, "agree_wording", renderAgreeWording(t))
}

func renderAgreeWording(t testing.TB) string {
	declaration := agreeLayout(agreeCaps, []int32{5, 4}, []int32{3, 2}, []int32{1, 0})
	declaration.Order = OrderDeclaration
	otherBuild := agreeLayout(agreeCaps, []int32{5, 4}, []int32{3, 2}, []int32{1, 0})
	otherBuild.Build = "goddp 'next'"
	many := agreeLayout([]int64{1, 2}, []int32{0, 1, 2, 3, 4}, []int32{5})
	manyOther := agreeLayout([]int64{1, 2}, []int32{5}, []int32{0, 1, 2, 3, 4})
	fewer := agreeLayout([]int64{1, 2}, []int32{5, 4}, []int32{3, 2, 1, 0})
	twoBuckets := agreeLayout([]int64{1, 2}, []int32{5, 4}, []int32{3, 2})
	otherCaps := agreeLayout([]int64{1, 2, 3}, []int32{5, 4}, []int32{3, 2}, []int32{1, 0})
	swapped := agreeLayout(agreeCaps, []int32{4, 5}, []int32{3, 2}, []int32{1, 0})
	unnamed := agreeLayout(agreeCaps, []int32{5, 40}, []int32{3, 2}, []int32{1, 0})
	failed := keeps(3, "fallback: planning failed")
	failed.Fingerprint = nil
	cases := []struct {
		name     string
		mayDefer bool
		st       []Statement
	}{
		{"install", true, []Statement{proposes(t, 1, agreeA), proposes(t, 0, agreeA)}},
		{"buckets hold others", true, []Statement{proposes(t, 0, agreeA), proposes(t, 1, agreeB), proposes(t, 2, agreeA)}},
		{"order within a bucket", true, []Statement{proposes(t, 0, agreeA), proposes(t, 1, swapped)}},
		{"more than three names", true, []Statement{proposes(t, 0, many), proposes(t, 1, manyOther)}},
		{"fewer buckets", true, []Statement{proposes(t, 0, agreeA), proposes(t, 1, fewer)}},
		{"more buckets", true, []Statement{proposes(t, 0, fewer), proposes(t, 1, agreeA)}},
		{"a bucket missing", true, []Statement{proposes(t, 0, agreeA), proposes(t, 1, twoBuckets)}},
		{"a bucket more", true, []Statement{proposes(t, 0, twoBuckets), proposes(t, 1, agreeA)}},
		{"caps", true, []Statement{proposes(t, 0, agreeA), proposes(t, 1, otherCaps)}},
		{"bucket order", true, []Statement{proposes(t, 0, agreeA), proposes(t, 1, declaration)}},
		{"build", true, []Statement{proposes(t, 0, agreeA), proposes(t, 1, otherBuild)}},
		{"unnamed position", true, []Statement{proposes(t, 0, agreeA), proposes(t, 1, unnamed)}},
		{"strict mismatch", true, []Statement{strict(proposes(t, 0, agreeA)), proposes(t, 1, agreeB), later(proposes(t, 2, agreeA)), failed}},
		{"lost", true, []Statement{lost(proposes(t, 3, agreeA), "injected"), proposes(t, 0, agreeA), lost(proposes(t, 1, agreeA), "rebuild failed")}},
		{"later", true, []Statement{proposes(t, 0, agreeA), later(proposes(t, 1, agreeA))}},
		{"later, deferred to", false, []Statement{proposes(t, 0, agreeA), later(proposes(t, 1, agreeA)), failed}},
		{"the same no", true, []Statement{keeps(1, "align_buckets=False"), keeps(0, "align_buckets=False")}},
	}
	var b strings.Builder
	for _, tc := range cases {
		v := agree(t, tc.mayDefer, tc.st...)
		fmt.Fprintf(&b, "== %s\n", tc.name)
		if v.Error != ErrorNone {
			fmt.Fprintf(&b, "error %s: %s\n", v.Error, v.Message)
			continue
		}
		fmt.Fprintf(&b, "%s layout_rank=%d disagreed=%v\nreason: %s\n", v.Action, v.LayoutRank, v.Disagreed, orNone(v.Reason))
	}
	return b.String()
}

// --------------------------------------------------------------------------
// Fuzzing against a naive reference

// randomStatements draws 1-4 ranks out of 0-7, each proposing one of three
// layouts, nothing, or later, maybe strict, maybe lost, maybe with a failed
// plan.
func randomStatements(rng *rand.Rand) []Statement {
	layouts := []*Layout{agreeA, agreeB, agreeLayout([]int64{7, 7, 7}, []int32{5, 4}, []int32{3, 2}, []int32{1, 0})}
	reasons := []string{"align_buckets=False", "fallback: x"}
	n := 1 + rng.IntN(4)
	ranks := rng.Perm(8)[:n]
	st := make([]Statement, n)
	for i, r := range ranks {
		var s Statement
		switch k := rng.IntN(6); {
		case k < 3:
			d, _ := LayoutDigest(layouts[k])
			s = Statement{Rank: r, Layout: layouts[k], Digest: &d}
		case k == 3:
			s = Statement{Rank: r, Reason: &reasons[rng.IntN(2)]}
		case k == 4:
			s = Statement{Rank: r, Later: true}
		default:
			s = Statement{Rank: r}
		}
		if rng.IntN(2) == 0 {
			s.Fingerprint = ptr(rng.Uint64() % 3)
		}
		s.Pieces = 1 + rng.IntN(3)
		s.Strict = rng.IntN(4) == 0
		if rng.IntN(10) == 0 {
			s.Lost = ptr("lost")
		}
		st[i] = s
	}
	return st
}

// naiveAction is the verdict as README.md states it, computed the obvious
// way: lost -> peer failed; differing layouts and strict -> mismatch; later
// and may defer -> later; every rank with the same digest -> install; else
// keep.
func naiveAction(st []Statement, mayDefer bool) (AgreeError, Action) {
	var digests []uint64
	anyLost, anyStrict, anyLater, allHave := false, false, false, true
	for _, s := range st {
		anyLost = anyLost || s.Lost != nil
		anyStrict = anyStrict || s.Strict
		anyLater = anyLater || s.Later
		if s.Layout != nil {
			digests = append(digests, *s.Digest)
		}
		allHave = allHave && s.Digest != nil
	}
	slices.Sort(digests)
	differ := len(slices.Compact(digests)) > 1
	switch {
	case anyLost:
		return ErrorPeerFailed, 0
	case differ && anyStrict:
		return ErrorPlanMismatch, 0
	case anyLater && mayDefer:
		return ErrorNone, ActionLater
	case allHave && !differ:
		return ErrorNone, ActionInstall
	}
	return ErrorNone, ActionKeep
}

func FuzzAgree(f *testing.F) {
	for i := range uint64(8) {
		f.Add(i, i%2 == 0)
	}
	f.Fuzz(func(t *testing.T, seed uint64, mayDefer bool) {
		st := randomStatements(rand.New(rand.NewPCG(seed, seed>>7)))
		v, err := Agree(&AgreeRequest{Statements: st, Names: agreeNames(), MayDefer: mayDefer})
		require.NoError(t, err)
		wantErr, wantAction := naiveAction(st, mayDefer)
		require.Equal(t, wantErr, v.Error, v.Message)
		if wantErr != ErrorNone {
			return
		}
		require.Equal(t, wantAction, v.Action)
		if v.Action == ActionInstall {
			require.Equal(t, slices.MinFunc(st, func(a, b Statement) int { return cmp.Compare(a.Rank, b.Rank) }).Rank, v.LayoutRank)
		}
		// Every rank that says something the others do not is named.
		if v.Action == ActionKeep && v.Disagreed && v.Reason != nil && strings.HasPrefix(*v.Reason, "the ranks did not") {
			for _, s := range st {
				assert.Contains(t, *v.Reason, fmt.Sprintf("rank %d: ", s.Rank))
			}
		}
	})
}

func TestAgreeMatchesTheNaiveReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 13))
	for range 2000 {
		st := randomStatements(rng)
		mayDefer := rng.IntN(2) == 0
		v, err := Agree(&AgreeRequest{Statements: st, Names: agreeNames(), MayDefer: mayDefer})
		require.NoError(t, err)
		wantErr, wantAction := naiveAction(st, mayDefer)
		require.Equal(t, wantErr, v.Error)
		if wantErr == ErrorNone {
			require.Equal(t, wantAction, v.Action)
		}
	}
}

func TestPyRepr(t *testing.T) {
	assert.Equal(t, `'goddp 1 abi 9'`, pyRepr("goddp 1 abi 9"))
	assert.Equal(t, `"it's"`, pyRepr("it's"))
	assert.Equal(t, `'both \' and "'`, pyRepr(`both ' and "`))
	assert.Equal(t, `'a\\b\n'`, pyRepr("a\\b\n"))
	// What CPython 3.11's repr() printed for each (non-printable runes are
	// escaped by size, printable ones kept).
	for in, want := range map[string]string{
		"\u0085": `'\x85'`, "\u200b": `'\u200b'`, "\u00a0": `'\xa0'`, "\U000e0001": `'\U000e0001'`,
		"é": `'é'`, "日本": `'日本'`, "\u2028": `'\u2028'`, "\x7f": `'\x7f'`, "a\u00adb": `'a\xadb'`,
	} {
		assert.Equal(t, want, pyRepr(in), "%q", in)
	}
}

func TestAgreeGivenUpRoundKeepsEverywhere(t *testing.T) {
	// The early rank saw only itself; the latecomer saw everyone, but the
	// round was settled as given up: both keep (Note [A round given up]).
	early, err := Agree(&AgreeRequest{
		Statements: []Statement{proposes(t, 0, agreeA)}, Names: agreeNames(), MayDefer: true,
		Unsettled: &Unsettled{StoppedBy: 0, Missing: []int{2, 1}},
	})
	require.NoError(t, err)
	late, err := Agree(&AgreeRequest{
		Statements: []Statement{proposes(t, 0, agreeA), proposes(t, 1, agreeA), proposes(t, 2, agreeA)},
		Names:      agreeNames(), MayDefer: true, Unsettled: &Unsettled{StoppedBy: 0},
	})
	require.NoError(t, err)
	for _, v := range []*Verdict{early, late} {
		assert.Equal(t, ErrorNone, v.Error)
		assert.Equal(t, ActionKeep, v.Action)
		assert.Equal(t, -1, v.LayoutRank)
		assert.False(t, v.Record.Aligned)
		require.NotNil(t, v.Reason)
		assert.Contains(t, *v.Reason, "every rank keeps DDP's own buckets and trains on")
	}
	assert.Contains(t, *early.Reason, "rank(s) [1 2] did not come to the agreement within the bounded wait (rank 0 stopped waiting first)")
	assert.Contains(t, *late.Reason, "rank 0 stopped waiting before this rank had seen every rank's statement")
	// Without Unsettled the latecomer's statements would install.
	assert.Equal(t, ActionInstall, agree(t, true, proposes(t, 0, agreeA), proposes(t, 1, agreeA), proposes(t, 2, agreeA)).Action)
}

func TestAgreeRefusesMalformedGivenUpRounds(t *testing.T) {
	for name, req := range map[string]*AgreeRequest{
		"negative stopper": {Statements: []Statement{proposes(t, 0, agreeA)}, Unsettled: &Unsettled{StoppedBy: -1}},
		"negative missing": {Statements: []Statement{proposes(t, 0, agreeA)}, Unsettled: &Unsettled{Missing: []int{-2}}},
		"missing and heard": {Statements: []Statement{proposes(t, 0, agreeA), proposes(t, 1, agreeA)},
			Unsettled: &Unsettled{Missing: []int{1}}},
		"install round": {Statements: []Statement{proposes(t, 0, agreeA)}, Unsettled: &Unsettled{},
			Installed: map[int]InstallReport{0: {}}},
	} {
		v, err := Agree(req)
		var perr *Error
		require.True(t, errors.As(err, &perr), "%s: no error; verdict %+v", name, v)
		assert.Equal(t, ErrInvalidConfig, perr.Code, name)
	}
}

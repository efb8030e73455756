package planner

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// Note [The agreement verdict]
//
// Every rank of a DDP module's process group brings one Statement to an
// agreement round (python/goddp/ranks/agreement.py, Note [Agreeing on DDP's
// layout]); the shim passes them through the c10d store and hands all of
// them here. Agree is a pure function of the statements, the parameter
// names and the round: every rank reads the same statements, so every rank
// reaches the same verdict, word for word, or raises the same error. Ranks
// are walked in ascending order and nothing iterates a map, so neither the
// order of arrival nor Go's map order reaches a message.
//
// The propose round, in this order:
//  1. a rank lost its reducer: ErrorPeerFailed, naming every such rank;
//  2. layouts differ (each compared with the lowest rank's that has one)
//     and some rank runs with strict=True: ErrorPlanMismatch, naming rank,
//     bucket and parameter, and listing what every rank said;
//  3. some rank will propose later and the round may defer: Later;
//  4. every rank gave the same layout digest: Install (the lowest rank's
//     layout);
//  5. otherwise Keep, with the differences, the one reason every rank gave,
//     or the listing; Disagreed when the ranks said different things.
//
// The install round (after an Install verdict, each rank says whether it
// installed): a rank that lost its reducer is ErrorPeerFailed; a rank that
// failed makes the verdict Keep for all ("the ranks agreed, but ...");
// otherwise the Install verdict stands.

// Action is what every rank does after an agreement round.
type Action int32

const (
	// ActionInstall: every rank installs the verdict's layout.
	ActionInstall Action = iota
	// ActionKeep: every rank keeps DDP's own buckets.
	ActionKeep
	// ActionLater: the ranks decide at the module's next training call.
	ActionLater
)

// String is the action's name in the plan record ("install", "keep",
// "later").
func (a Action) String() string {
	switch a {
	case ActionInstall:
		return "install"
	case ActionKeep:
		return "keep"
	case ActionLater:
		return "later"
	}
	return fmt.Sprintf("Action(%d)", int32(a))
}

// AgreeError names the error every rank raises instead of acting.
type AgreeError int32

const (
	// ErrorNone: no error; the verdict's Action holds.
	ErrorNone AgreeError = iota
	// ErrorPeerFailed: some rank cannot train on (its reducer is lost).
	ErrorPeerFailed
	// ErrorPlanMismatch: the layouts differ and some rank runs strict.
	ErrorPlanMismatch
)

// String is the error's name on the wire ("peer_failed", "plan_mismatch";
// "" for none).
func (e AgreeError) String() string {
	switch e {
	case ErrorNone:
		return ""
	case ErrorPeerFailed:
		return "peer_failed"
	case ErrorPlanMismatch:
		return "plan_mismatch"
	}
	return fmt.Sprintf("AgreeError(%d)", int32(e))
}

// Statement is what one rank says at an agreement round.
type Statement struct {
	Rank int
	// Layout is the layout the rank proposes for DDP's buckets; nil when it
	// proposes none (Reason says why) or will propose later.
	Layout *Layout
	// Digest is LayoutDigest(Layout) as the rank computed it.
	Digest *uint64
	Reason *string
	// Later: the rank's graphs so far hold only part of DDP's parameters.
	Later bool
	// Strict: the rank asks that differing layouts be an error.
	Strict bool
	// Lost says why the rank cannot go on (its reducer could not be rebuilt).
	Lost *string
	// Fingerprint and Pieces are the rank's plan, for the record only (nil:
	// planning failed).
	Fingerprint *uint64
	Pieces      int
}

// InstallReport is what one rank says after installing an Install verdict.
type InstallReport struct {
	// Failed says why installing failed (DDP's own buckets were put back);
	// Lost, why even that failed. Empty: nothing to say.
	Failed, Lost string
}

// AgreeRequest is one agreement round of a DDP module's ranks.
type AgreeRequest struct {
	Statements []Statement
	// Names are DDP's parameter names by DDP position; a position without
	// one is called "parameter <p>".
	Names map[int32]string
	// MayDefer: a Later statement defers the decision (false at the round
	// that was deferred to).
	MayDefer bool
	// Installed, when not nil, makes this the install round: what each rank
	// said after installing the Install verdict of these statements.
	Installed map[int]InstallReport
	// Unsettled, when not nil, says the round was given up (Note [A round
	// given up]): Statements are then only those this rank saw.
	Unsettled *Unsettled
	// Group, when not nil, names the round's process group: the verdict
	// then carries its outcome line (Note [Words from the planner]).
	Group *AgreeGroup
}

// Unsettled is how a given-up round ended, as one rank saw it.
type Unsettled struct {
	// StoppedBy is the rank whose bounded wait ran out first.
	StoppedBy int
	// Missing are the ranks whose statements this rank never saw (none for
	// a rank that came after the others had stopped waiting).
	Missing []int
}

// Note [A round given up]
//
// A rank may not come to a round in time: it still compiles, it crashed,
// or Dynamo ran the frame eagerly there and it never comes at all. The
// first rank whose bounded wait runs out settles the round as given up,
// and every rank follows that one outcome (goddp.ranks.store_round), so
// the verdict is Keep on every rank, whatever each saw (the reason says
// what this rank saw, and so may differ between ranks; the action never): nobody has
// installed anything yet, so all of them train on with DDP's own buckets
// and pair in DDP's allreduces, the latecomer too. It is never an error:
// a rank that crashed is reported by DDP's first collective, as in eager
// DDP. Only the install round, which every rank that decided Install
// reaches at the same call, still fails when a rank does not come.

// Verdict is what every rank of the group does.
type Verdict struct {
	// Error, when not ErrorNone, is raised on every rank with Message; the
	// other fields are then empty.
	Error   AgreeError
	Message string

	Action Action
	// LayoutRank is the rank whose Layout every rank installs (Install
	// only; -1 otherwise).
	LayoutRank int
	// Reason says why not Install; nil when Install (or when every rank
	// kept DDP's buckets without saying why).
	Reason *string
	// Disagreed: the ranks said different things (worth a WARNING).
	Disagreed bool
	// Record is the plan record's view of the verdict.
	Record AgreementRecord
	// Log is the line every rank logs for the verdict (nil without the
	// request's Group, and for an error).
	Log *LogLine
}

// AgreementRecord is the "plan_check" entry of goddp's plan records
// (python/goddp/reports/records.py), less what only the shim knows (the
// group's name and size, the seconds the round took).
type AgreementRecord struct {
	Aligned      bool
	Action       Action
	Caps         []int64 // nil unless Install
	LayoutDigest *uint64
	Reason       *string
	Ranks        []RankRecord
}

// RankRecord is what one rank said, for the record.
type RankRecord struct {
	Rank         int
	Fingerprint  *uint64
	Pieces       int
	LayoutDigest *uint64
	Caps         []int64 // nil without a layout
	Reason       *string
	Later        bool
}

// Agree decides one agreement round (Note [The agreement verdict]). It
// fails with ErrInvalidConfig for a round no ranks of goddp could have
// made (Note [What Agree refuses]).
func Agree(req *AgreeRequest) (*Verdict, error) {
	if req.Group != nil && req.Group.Size < 1 {
		return nil, errorf(ErrInvalidConfig, "planner: process group %s has %d ranks; want at least 1", pyRepr(req.Group.Name), req.Group.Size)
	}
	v, err := agreeRound(req)
	if err == nil && req.Group != nil && v.Error == ErrorNone {
		v.Log = outcomeLine(v, req.Group)
	}
	return v, err
}

func agreeRound(req *AgreeRequest) (*Verdict, error) {
	a := &agreement{names: req.Names}
	if err := a.sortStatements(req.Statements); err != nil {
		return nil, err
	}
	if err := a.check(); err != nil {
		return nil, err
	}
	if req.Unsettled != nil {
		if req.Installed != nil {
			return nil, errorf(ErrInvalidConfig, "planner: an install round cannot be given up")
		}
		return a.givenUp(req.Unsettled)
	}
	if req.Installed == nil {
		return a.propose(req.MayDefer), nil
	}
	if err := a.checkInstalled(req.Installed); err != nil {
		return nil, err
	}
	v := a.propose(false)
	if v.Error != ErrorNone || v.Action != ActionInstall {
		return nil, errorf(ErrInvalidConfig, "planner: an install round needs statements that agree on one layout")
	}
	return a.confirm(v, req.Installed), nil
}

// Note [What Agree refuses]
//
// Agree is the one validator of an agreement round; the bridge only
// converts. A verdict is only as good as the statements, so Agree refuses
// (ErrInvalidConfig, the same error on every rank, since every rank reads
// the same statements) rather than decide on:
//   - no statement, a repeated rank, or a negative rank (-1 is the verdict's
//     "no layout");
//   - a layout without its digest, or a digest without a layout;
//   - a negative piece count (a record-only field, but no rank runs fewer
//     than no pieces);
//   - a digest that is not LayoutDigest of its layout (Agree recomputes it:
//     equal digests must mean equal layouts, or two ranks could install
//     different caps), or a layout no DDP module could have;
//   - a name for a negative DDP position;
//   - at an install round, reports that are not from exactly the ranks
//     that made statements;
//   - a process group (for the outcome line) of no rank.

// agreement is one round's statements in rank order.
type agreement struct {
	st    []Statement
	names map[int32]string
}

func (a *agreement) sortStatements(in []Statement) error {
	if len(in) == 0 {
		return errorf(ErrInvalidConfig, "planner: an agreement needs at least one statement")
	}
	a.st = slices.Clone(in)
	slices.SortFunc(a.st, func(x, y Statement) int { return cmp.Compare(x.Rank, y.Rank) })
	if r := a.st[0].Rank; r < 0 {
		return errorf(ErrInvalidConfig, "planner: rank %d is not a rank (ranks are 0 or more)", r)
	}
	for i := 1; i < len(a.st); i++ {
		if a.st[i].Rank == a.st[i-1].Rank {
			return errorf(ErrInvalidConfig, "planner: rank %d made two statements", a.st[i].Rank)
		}
	}
	return nil
}

// check refuses statements no rank could have made (Note [What Agree
// refuses]); a.st is sorted.
func (a *agreement) check() error {
	for i := range a.st {
		s := &a.st[i]
		switch {
		case s.Layout == nil && s.Digest != nil:
			return errorf(ErrInvalidConfig, "planner: rank %d gave a layout digest without a layout", s.Rank)
		case s.Layout != nil && s.Digest == nil:
			return errorf(ErrInvalidConfig, "planner: rank %d gave a layout without its digest", s.Rank)
		case s.Pieces < 0:
			return errorf(ErrInvalidConfig, "planner: rank %d runs %d pieces (a count is 0 or more)", s.Rank, s.Pieces)
		case s.Layout == nil:
			continue
		}
		d, err := LayoutDigest(s.Layout)
		if err != nil {
			return errorf(ErrInvalidConfig, "planner: rank %d proposed a layout no DDP module could have: %v", s.Rank, err)
		}
		if d != *s.Digest {
			return errorf(ErrInvalidConfig, "planner: rank %d gave layout digest %016x for a layout whose digest is %016x", s.Rank, *s.Digest, d)
		}
	}
	for _, p := range sortedKeys(a.names) {
		if p < 0 {
			return errorf(ErrInvalidConfig, "planner: a name for DDP position %d (positions are 0 or more)", p)
		}
	}
	return nil
}

// checkInstalled: the install round hears from exactly the ranks that made
// statements.
func (a *agreement) checkInstalled(installed map[int]InstallReport) error {
	for _, s := range a.st {
		if _, ok := installed[s.Rank]; !ok {
			return errorf(ErrInvalidConfig, "planner: the install round has no report from rank %d", s.Rank)
		}
	}
	for _, r := range sortedKeys(installed) {
		if !slices.ContainsFunc(a.st, func(s Statement) bool { return s.Rank == r }) {
			return errorf(ErrInvalidConfig, "planner: the install round has a report from rank %d, which made no statement", r)
		}
	}
	return nil
}

func (a *agreement) propose(mayDefer bool) *Verdict {
	if msg := peerFailed(a.lost()); msg != "" {
		return &Verdict{Error: ErrorPeerFailed, Message: msg, LayoutRank: -1}
	}
	diffs := a.differences()
	if len(diffs) > 0 && a.anyStrict() {
		return &Verdict{Error: ErrorPlanMismatch, LayoutRank: -1, Message: "goddp: the ranks of this DDP module " +
			"proposed different layouts for DDP's buckets (" + strings.Join(diffs, "; ") + "): " + a.listing() +
			". strict=True makes this an error; without it every rank keeps DDP's own buckets and trains on."}
	}
	if mayDefer && a.anyLater() {
		return a.verdict(ActionLater, -1, ptr("some rank will propose its layout at the next training call"), false)
	}
	if a.sameDigest() {
		return a.verdict(ActionInstall, 0, nil, false)
	}
	said := a.distinctSayings()
	var reason *string
	switch {
	case len(diffs) > 0:
		reason = ptr("the ranks' layouts differ: " + strings.Join(diffs, "; "))
	case said == 1:
		reason = a.st[0].Reason
	default:
		reason = ptr("the ranks did not all propose the same layout: " + a.listing())
	}
	return a.verdict(ActionKeep, -1, reason, said > 1)
}

// givenUp is the verdict of a round given up (Note [A round given up]).
func (a *agreement) givenUp(u *Unsettled) (*Verdict, error) {
	missing := slices.Clone(u.Missing)
	slices.Sort(missing)
	if u.StoppedBy < 0 || slices.ContainsFunc(missing, func(r int) bool { return r < 0 }) {
		return nil, errorf(ErrInvalidConfig, "planner: a given-up round names a negative rank")
	}
	for _, s := range a.st {
		if slices.Contains(missing, s.Rank) {
			return nil, errorf(ErrInvalidConfig, "planner: rank %d is both missing and heard from", s.Rank)
		}
	}
	var why string
	if len(missing) > 0 {
		why = fmt.Sprintf("rank(s) %v did not come to the agreement within the bounded wait (rank %d stopped waiting first)",
			missing, u.StoppedBy)
	} else {
		why = fmt.Sprintf("rank %d stopped waiting before this rank had seen every rank's statement", u.StoppedBy)
	}
	return a.verdict(ActionKeep, -1, ptr(why+"; every rank keeps DDP's own buckets and trains on"), true), nil
}

// confirm is the install round after the Install verdict v.
func (a *agreement) confirm(v *Verdict, installed map[int]InstallReport) *Verdict {
	ranks := sortedKeys(installed)
	lost := make([]rankSaid, 0)
	failed := make([]string, 0)
	for _, r := range ranks {
		if s := installed[r]; s.Lost != "" {
			lost = append(lost, rankSaid{r, s.Lost})
		} else if s.Failed != "" {
			failed = append(failed, fmt.Sprintf("rank %d: %s", r, s.Failed))
		}
	}
	if msg := peerFailed(lost); msg != "" {
		return &Verdict{Error: ErrorPeerFailed, Message: msg, LayoutRank: -1}
	}
	if len(failed) == 0 {
		return v
	}
	return a.verdict(ActionKeep, -1, ptr("the ranks agreed, but "+strings.Join(failed, "; ")), true)
}

// verdict builds a verdict and its record; layoutAt indexes a.st (-1: no
// layout).
func (a *agreement) verdict(action Action, layoutAt int, reason *string, disagreed bool) *Verdict {
	v := &Verdict{Action: action, LayoutRank: -1, Reason: reason, Disagreed: disagreed}
	v.Record = AgreementRecord{Aligned: action == ActionInstall, Action: action, Reason: reason}
	if layoutAt >= 0 {
		s := &a.st[layoutAt]
		v.LayoutRank = s.Rank
		v.Record.Caps = capsOf(s.Layout)
		v.Record.LayoutDigest = s.Digest
	}
	for _, s := range a.st {
		v.Record.Ranks = append(v.Record.Ranks, RankRecord{
			Rank: s.Rank, Fingerprint: s.Fingerprint, Pieces: s.Pieces, LayoutDigest: s.Digest,
			Caps: capsOf(s.Layout), Reason: s.Reason, Later: s.Later,
		})
	}
	return v
}

type rankSaid struct {
	rank int
	what string
}

func (a *agreement) lost() []rankSaid {
	var out []rankSaid
	for _, s := range a.st {
		if s.Lost != nil {
			out = append(out, rankSaid{s.Rank, *s.Lost})
		}
	}
	return out
}

// peerFailed is the message for ranks that lost their reducer ("" for none).
func peerFailed(lost []rankSaid) string {
	if len(lost) == 0 {
		return ""
	}
	parts := make([]string, len(lost))
	for i, l := range lost {
		parts[i] = fmt.Sprintf("rank %d (%s)", l.rank, l.what)
	}
	return "goddp: DDP's reducer could not be rebuilt on " + strings.Join(parts, ", ") +
		"; every rank stops rather than train without gradient allreduces"
}

// differences says, per rank whose layout digest differs from the lowest
// rank's with a layout, what differs.
func (a *agreement) differences() []string {
	var first *Statement
	var out []string
	for i := range a.st {
		s := &a.st[i]
		if s.Layout == nil {
			continue
		}
		if first == nil {
			first = s
			continue
		}
		if !sameU64(s.Digest, first.Digest) {
			me, them := fmt.Sprintf("rank %d", s.Rank), fmt.Sprintf("rank %d", first.Rank)
			what := LayoutDifference(s.Layout, first.Layout, a.name, me, them)
			if what == "" {
				what = fmt.Sprintf("the layout digests of %s and %s differ", me, them)
			}
			out = append(out, what)
		}
	}
	return out
}

func (a *agreement) anyStrict() bool {
	return slices.ContainsFunc(a.st, func(s Statement) bool { return s.Strict })
}

func (a *agreement) anyLater() bool {
	return slices.ContainsFunc(a.st, func(s Statement) bool { return s.Later })
}

// sameDigest: every rank gave a digest, and the same one.
func (a *agreement) sameDigest() bool {
	for _, s := range a.st {
		if s.Digest == nil || *s.Digest != *a.st[0].Digest {
			return false
		}
	}
	return true
}

// distinctSayings counts the different things the ranks said: digest,
// reason, later, and whether planning failed.
func (a *agreement) distinctSayings() int {
	type saying struct {
		hasDigest bool
		digest    uint64
		hasReason bool
		reason    string
		later     bool
		failed    bool
	}
	seen := make([]saying, 0, len(a.st))
	for _, s := range a.st {
		k := saying{later: s.Later, failed: s.Fingerprint == nil}
		if s.Digest != nil {
			k.hasDigest, k.digest = true, *s.Digest
		}
		if s.Reason != nil {
			k.hasReason, k.reason = true, *s.Reason
		}
		if !slices.Contains(seen, k) {
			seen = append(seen, k)
		}
	}
	return len(seen)
}

// listing is what every rank said, in rank order.
func (a *agreement) listing() string {
	parts := make([]string, len(a.st))
	for i := range a.st {
		parts[i] = fmt.Sprintf("rank %d: %s", a.st[i].Rank, a.st[i].describe())
	}
	return strings.Join(parts, "; ")
}

func (a *agreement) name(p int32) string {
	if n, ok := a.names[p]; ok {
		return n
	}
	return fmt.Sprintf("parameter %d", p)
}

// describe is one rank's statement in words.
func (s *Statement) describe() string {
	plan := "planning failed"
	if s.Fingerprint != nil {
		plan = fmt.Sprintf("plan %016x, %d pieces", *s.Fingerprint, s.Pieces)
	}
	switch {
	case s.Lost != nil:
		return plan + "; lost DDP's reducer: " + *s.Lost
	case s.Layout != nil:
		var d uint64
		if s.Digest != nil {
			d = *s.Digest
		}
		return fmt.Sprintf("%s; proposes DDP buckets %s bytes (layout %016x)", plan, intList(s.Layout.Caps), d)
	case s.Later:
		return plan + "; will propose at the next training call"
	}
	return plan + "; keeps DDP's buckets: " + orNone(s.Reason)
}

// LayoutDifference says in words what first differs between layout a
// (called me) and b (them), naming parameters by name; "" when they are
// equal. The words are the ones goddp's users read in its WARNING and
// errors (testdata/agree_wording.golden).
func LayoutDifference(a, b *Layout, name func(int32) string, me, them string) string {
	if a.Build != b.Build {
		return fmt.Sprintf("%s was made by %s, %s by %s", me, pyRepr(a.Build), them, pyRepr(b.Build))
	}
	if a.Order != b.Order {
		return fmt.Sprintf("%s has bucket order %s, %s %s", me, pyRepr(a.Order.Name()), them, pyRepr(b.Order.Name()))
	}
	for k := range max(len(a.Buckets), len(b.Buckets)) {
		mine, theirs := bucketAt(a, k), bucketAt(b, k)
		if slices.Equal(mine, theirs) {
			continue
		}
		if len(mine) == 0 || len(theirs) == 0 {
			fewer, more := them, me
			if len(mine) == 0 {
				fewer, more = me, them
			}
			return fmt.Sprintf("%s has a bucket %d, %s has %d buckets", more, k, fewer, k)
		}
		onlyMine, onlyTheirs := without(mine, theirs), without(theirs, mine)
		if len(onlyMine) == 0 && len(onlyTheirs) == 0 {
			return fmt.Sprintf("bucket %d: %s orders its parameters %s, %s %s", k, me, names(mine, name), them, names(theirs, name))
		}
		return fmt.Sprintf("bucket %d: %s holds %s where %s holds %s", k, me, namesOr(onlyMine, name), them, namesOr(onlyTheirs, name))
	}
	if !slices.Equal(a.Caps, b.Caps) {
		return fmt.Sprintf("%s gives DDP caps %s bytes, %s %s", me, intList(a.Caps), them, intList(b.Caps))
	}
	return ""
}

// Name is the order's name in layouts and messages ("ready",
// "declaration").
func (o BucketOrder) Name() string {
	switch o {
	case OrderReady:
		return "ready"
	case OrderDeclaration:
		return "declaration"
	}
	return fmt.Sprintf("order %d", int32(o))
}

func bucketAt(l *Layout, k int) []int32 {
	if k < len(l.Buckets) {
		return l.Buckets[k].Positions
	}
	return nil
}

// without is the positions of xs that ys lacks, in xs's order.
func without(xs, ys []int32) []int32 {
	var out []int32
	for _, x := range xs {
		if !slices.Contains(ys, x) {
			out = append(out, x)
		}
	}
	return out
}

// names shows up to three parameters by name, then how many more.
func names(ps []int32, name func(int32) string) string {
	const shown = 3
	parts := make([]string, 0, shown)
	for _, p := range ps[:min(shown, len(ps))] {
		parts = append(parts, name(p))
	}
	more := ""
	if len(ps) > shown {
		more = fmt.Sprintf(" and %d more", len(ps)-shown)
	}
	return "[" + strings.Join(parts, ", ") + more + "]"
}

func namesOr(ps []int32, name func(int32) string) string {
	if len(ps) == 0 {
		return "nothing else"
	}
	return names(ps, name)
}

// intList writes ints as a Python list does: "[1, 2]".
func intList(xs []int64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatInt(x, 10)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// pyRepr quotes s as Python's repr() quotes a printable string: single
// quotes unless s holds a single quote and no double one, so that a build
// name reads the same in goddp's messages as it did when Python wrote them.
func pyRepr(s string) string {
	q := "'"
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		q = `"`
	}
	var b strings.Builder
	b.WriteString(q)
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case string(r) == q:
			b.WriteString(`\` + q)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x100 && !unicode.IsPrint(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case r < 0x10000 && !unicode.IsPrint(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		case !unicode.IsPrint(r):
			fmt.Fprintf(&b, `\U%08x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteString(q)
	return b.String()
}

func capsOf(l *Layout) []int64 {
	if l == nil {
		return nil
	}
	return append(make([]int64, 0, len(l.Caps)), l.Caps...)
}

func sameU64(a, b *uint64) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

func orNone(s *string) string {
	if s == nil {
		return "None"
	}
	return *s
}

func ptr[T any](v T) *T { return &v }

func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

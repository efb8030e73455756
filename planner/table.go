package planner

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// This file renders the plan table, the readable form of a plan that the
// backend logs at INFO (option log_plan). The table is pure formatting of
// the planner's answer; the caller only adds which pieces share one
// compiled callable, which it learns by comparing the cut pieces.

// TableView is what the plan table shows of one plan, under the names of
// the plan records (goddp.last_plans()): the bridge decodes it from JSON,
// Go callers build it with ViewOf.
type TableView struct {
	Fingerprint uint64        `json:"fingerprint"`
	Mode        string        `json:"mode"`
	NumPieces   int           `json:"num_pieces"`
	Caps        TableCaps     `json:"caps"`
	Buckets     []TableBucket `json:"buckets"`
	Alignment   string        `json:"alignment"`
	MergedCuts  int           `json:"merged_cuts"`
	// SameAs names, per piece, the piece whose compiled callable it runs
	// (itself unless reused); nil when the pieces were not compared.
	SameAs []int `json:"same_as"`
	// Eager lists the pieces that run eagerly (option edges).
	Eager []int `json:"eager"`
}

// TableCaps are the settings the plan stands for (Decision.Config).
type TableCaps struct {
	BucketCapBytes      int64   `json:"bucket_cap_bytes"`
	FirstBucketCapBytes int64   `json:"first_bucket_cap_bytes"`
	BucketCapsBytes     []int64 `json:"bucket_caps_bytes"`
	MaxPieces           int     `json:"max_pieces"` // 0 (or JSON null): no limit
	AlignBuckets        bool    `json:"align_buckets"`
}

// TableBucket is one bucket row group of the table, in DDP order.
type TableBucket struct {
	Index      int      `json:"index"`
	Bytes      int64    `json:"bytes"`
	ParamNames []string `json:"param_names"`
	Piece      int      `json:"piece"`
	Extended   bool     `json:"extended"`
}

// String is the mode as options and records name it.
func (m Mode) String() string {
	switch m {
	case ModeDDP:
		return "ddp"
	case ModeTorch:
		return "torch"
	}
	return "unknown"
}

// ViewOf is the table view of a decision on g, before any piece is
// compared (SameAs nil); Eager holds the decision's edge pieces.
func ViewOf(g *Graph, d *Decision) TableView {
	v := TableView{
		Fingerprint: d.Plan.Fingerprint,
		Mode:        d.Config.Mode.String(),
		NumPieces:   d.Plan.NumPieces,
		Caps: TableCaps{
			BucketCapBytes:      d.Config.BucketCapBytes,
			FirstBucketCapBytes: d.Config.FirstBucketCapBytes,
			BucketCapsBytes:     d.Config.BucketCapsBytes,
			MaxPieces:           d.Config.MaxPieces,
			AlignBuckets:        d.Config.AlignBuckets,
		},
		Alignment:  d.Plan.Alignment.String(),
		MergedCuts: d.Plan.MergedCuts,
	}
	for _, p := range d.EagerPieces {
		v.Eager = append(v.Eager, int(p))
	}
	for k, b := range d.Plan.Buckets {
		names := make([]string, len(b.Params))
		for i, p := range b.Params {
			names[i] = g.Params[p].Name
		}
		v.Buckets = append(v.Buckets, TableBucket{Index: k, Bytes: b.Bytes, ParamNames: names, Piece: b.Piece, Extended: b.Extended})
	}
	return v
}

// Table renders the plan table: a head line (mode, fingerprint, counts,
// caps in MiB, the alignment, and with SameAs the distinct and reused
// pieces), a line naming the reused pieces, a line naming the eager ones,
// then one row per parameter with its bucket's index, size (MiB) and piece
// on the bucket's first row. A NUL in a name or word is written \x00: the
// table crosses the C ABI as a NUL-terminated string, which a NUL would
// cut short.
func (v *TableView) Table() string {
	lines := []string{v.head()}
	if reused := v.reused(); len(reused) > 0 {
		lines = append(lines, "reused compiled pieces (piece=the piece compiled for it): "+strings.Join(reused, " "))
	}
	if len(v.Eager) > 0 {
		lines = append(lines, "eager pieces (edges outside the repeated blocks, not compiled; option edges): "+joinInts(v.Eager, " "))
	}
	return strings.ReplaceAll(strings.Join(append(lines, v.rows()...), "\n"), "\x00", `\x00`)
}

// mibText is bytes in MiB with the given decimals.
func mibText(bytes int64, decimals int) string {
	return strconv.FormatFloat(float64(bytes)/(1<<20), 'f', decimals, 64)
}

func (v *TableView) head() string {
	c := &v.Caps
	var s strings.Builder
	fmt.Fprintf(&s, "goddp plan: mode=%s fingerprint=%016x pieces=%d buckets=%d cap=%s MiB first=%s MiB",
		v.Mode, v.Fingerprint, v.NumPieces, len(v.Buckets), mibText(c.BucketCapBytes, 2), mibText(c.FirstBucketCapBytes, 2))
	if len(c.BucketCapsBytes) > 0 {
		caps := make([]string, len(c.BucketCapsBytes))
		for i, b := range c.BucketCapsBytes {
			caps[i] = mibText(b, 2)
		}
		s.WriteString(" per-bucket=[" + strings.Join(caps, ", ") + "] MiB")
	}
	if c.MaxPieces != 0 {
		fmt.Fprintf(&s, " max_pieces=%d", c.MaxPieces)
	}
	if c.AlignBuckets {
		s.WriteString(" (DDP's buckets set to the pieces: " + v.Alignment)
		if v.MergedCuts != 0 {
			fmt.Fprintf(&s, ", %d cuts merged", v.MergedCuts)
		}
		s.WriteString(")")
	}
	if v.SameAs != nil {
		n := len(v.reused())
		fmt.Fprintf(&s, " distinct pieces=%d reused=%d", len(v.SameAs)-n, n)
	}
	return s.String()
}

// reused is "piece=leader" for each piece that runs another's callable.
func (v *TableView) reused() []string {
	var out []string
	for p, leader := range v.SameAs {
		if p != leader {
			out = append(out, fmt.Sprintf("%d=%d", p, leader))
		}
	}
	return out
}

// rows is the bucket table, its first three columns padded to their widest
// cell (counted in characters), the parameter names last.
func (v *TableView) rows() []string {
	cells := [][4]string{{"bucket", "MiB", "piece", "params"}}
	for _, b := range v.Buckets {
		names := b.ParamNames
		if len(names) == 0 {
			names = []string{"(none)"}
		}
		piece := strconv.Itoa(b.Piece)
		if b.Extended {
			piece += " (extended)"
		}
		cells = append(cells, [4]string{strconv.Itoa(b.Index), mibText(b.Bytes, 3), piece, names[0]})
		for _, name := range names[1:] {
			cells = append(cells, [4]string{"", "", "", name})
		}
	}
	var widths [3]int
	for _, row := range cells {
		for i := range widths {
			widths[i] = max(widths[i], utf8.RuneCountInString(row[i]))
		}
	}
	out := make([]string, len(cells))
	for r, row := range cells {
		var s strings.Builder
		for i, w := range widths {
			s.WriteString(row[i] + strings.Repeat(" ", w-utf8.RuneCountInString(row[i])) + "  ")
		}
		out[r] = s.String() + row[3]
	}
	return out
}

func joinInts(xs []int, sep string) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = strconv.Itoa(x)
	}
	return strings.Join(out, sep)
}

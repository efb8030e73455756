package planner

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// validGraph is a small well-formed graph the bad-input cases corrupt:
// x, w placeholders; lin = linear(x, w); out.
func validGraph() *Graph {
	b := &graphBuilder{}
	w := b.param("fc.weight", 100)
	x := b.placeholder("x")
	pw := b.placeholder("l_fc_weight")
	lin := b.call("linear", in(x, pw), arg(w))
	b.output(lin)
	return b.graph()
}

func TestBuildRejectsBadInput(t *testing.T) {
	okCfg := ddpCfg(1000, 100)
	cases := []struct {
		name    string
		graph   func(g *Graph) *Graph // corrupts a fresh validGraph
		cfg     func(c *Config)
		code    ErrorCode
		message string // a fragment the message must contain
	}{
		// Config.
		{name: "unknown mode", cfg: func(c *Config) { c.Mode = 7 }, code: ErrInvalidConfig, message: "ModeDDP"},
		{name: "negative mode", cfg: func(c *Config) { c.Mode = -1 }, code: ErrInvalidConfig, message: "unknown mode -1"},
		{name: "zero cap", cfg: func(c *Config) { c.BucketCapBytes = 0 }, code: ErrInvalidConfig, message: "BucketCapBytes"},
		{name: "negative cap", cfg: func(c *Config) { c.BucketCapBytes = -5 }, code: ErrInvalidConfig, message: "BucketCapBytes"},
		{name: "zero first cap", cfg: func(c *Config) { c.FirstBucketCapBytes = 0 }, code: ErrInvalidConfig, message: "FirstBucketCapBytes"},
		{name: "first cap above cap", cfg: func(c *Config) { c.FirstBucketCapBytes = 1001 }, code: ErrInvalidConfig, message: "must not exceed"},
		{name: "zero per-bucket cap", cfg: func(c *Config) { c.BucketCapsBytes = []int64{10, 0} }, code: ErrInvalidConfig, message: "BucketCapsBytes[1]"},
		{name: "negative max pieces", cfg: func(c *Config) { c.MaxPieces = -1 }, code: ErrInvalidConfig, message: "MaxPieces"},
		{name: "torch with max pieces", cfg: func(c *Config) { c.Mode = ModeTorch; c.MaxPieces = 2 }, code: ErrInvalidConfig, message: "ModeTorch"},
		{name: "torch with per-bucket caps", cfg: func(c *Config) { c.Mode = ModeTorch; c.BucketCapsBytes = []int64{10} }, code: ErrInvalidConfig, message: "ModeTorch"},
		{name: "torch with align buckets", cfg: func(c *Config) { c.Mode = ModeTorch; c.AlignBuckets = true }, code: ErrInvalidConfig, message: "AlignBuckets is not supported in ModeTorch"},
		// Graph shape.
		{name: "nil graph", graph: func(*Graph) *Graph { return nil }, code: ErrInvalidGraph, message: "nil"},
		{name: "empty graph", graph: func(*Graph) *Graph { return &Graph{} }, code: ErrInvalidGraph, message: "no nodes"},
		{name: "module ids short", graph: func(g *Graph) *Graph { g.ModuleIDs = g.ModuleIDs[:2]; return g }, code: ErrInvalidGraph, message: "ModuleIDs"},
		{name: "module id below -1", graph: func(g *Graph) *Graph { g.ModuleIDs[2] = -2; return g }, code: ErrInvalidGraph, message: "node 2: module id -2"},
		{name: "param offsets short", graph: func(g *Graph) *Graph { g.ParamOffsets = g.ParamOffsets[:4]; return g }, code: ErrInvalidGraph, message: "ParamOffsets has 4"},
		{name: "param offsets not from 0", graph: func(g *Graph) *Graph { g.ParamOffsets[0] = 1; return g }, code: ErrInvalidGraph, message: "ParamOffsets[0]"},
		{name: "param offsets decrease", graph: func(g *Graph) *Graph {
			g.ParamOffsets = []int64{0, 1, 0, 1, 1}
			return g
		}, code: ErrInvalidGraph, message: "decreases at node 1"},
		{name: "param offsets end short", graph: func(g *Graph) *Graph {
			g.ParamIndex = append(g.ParamIndex, 0)
			g.ParamRefs = append(g.ParamRefs, RefArg)
			return g
		}, code: ErrInvalidGraph, message: "ParamOffsets ends at 1"},
		{name: "refs length mismatch", graph: func(g *Graph) *Graph { g.ParamRefs = nil; return g }, code: ErrInvalidGraph, message: "ParamRefs"},
		{name: "user offsets short", graph: func(g *Graph) *Graph { g.UserOffsets = g.UserOffsets[:1]; return g }, code: ErrInvalidGraph, message: "UserOffsets"},
		{name: "user offsets end beyond users", graph: func(g *Graph) *Graph { g.UserOffsets[4] = 9; return g }, code: ErrInvalidGraph, message: "UserOffsets ends at 9"},
		{name: "op kind too large", graph: func(g *Graph) *Graph { g.Ops[2] = 6; return g }, code: ErrInvalidGraph, message: "node 2: op kind 6"},
		{name: "op kind negative", graph: func(g *Graph) *Graph { g.Ops[1] = -1; return g }, code: ErrInvalidGraph, message: "node 1: op kind -1"},
		{name: "ref kind out of range", graph: func(g *Graph) *Graph { g.ParamRefs[0] = 4; return g }, code: ErrInvalidGraph, message: `node 2: reference kind 4 to parameter 0 ("fc.weight")`},
		{name: "param index too large", graph: func(g *Graph) *Graph { g.ParamIndex[0] = 1; return g }, code: ErrInvalidGraph, message: "node 2: parameter index 1 out of range"},
		{name: "param index negative", graph: func(g *Graph) *Graph { g.ParamIndex[0] = -1; return g }, code: ErrInvalidGraph, message: "parameter index -1"},
		{name: "module ref without module id", graph: func(g *Graph) *Graph {
			g.Ops[2] = OpCallModule
			g.ParamRefs[0] = RefModule
			return g
		}, code: ErrInvalidGraph, message: "no module id"},
		{name: "user index too large", graph: func(g *Graph) *Graph { g.Users[0] = 4; return g }, code: ErrInvalidGraph, message: "user index 4 out of range"},
		{name: "user index negative", graph: func(g *Graph) *Graph { g.Users[0] = -3; return g }, code: ErrInvalidGraph, message: "user index -3"},
		{name: "user before node", graph: func(g *Graph) *Graph { g.Users[2] = 1; return g }, code: ErrInvalidGraph, message: "node 2: user 1 does not come after it"},
		{name: "self edge", graph: func(g *Graph) *Graph { g.Users[2] = 2; return g }, code: ErrInvalidGraph, message: "node 2: user 2"},
		{name: "placeholder as user", graph: func(g *Graph) *Graph { g.Users[0] = 1; return g }, code: ErrInvalidGraph, message: "user 1 is a placeholder"},
		{name: "no output", graph: func(g *Graph) *Graph { g.Ops[3] = OpCallFunction; return g }, code: ErrInvalidGraph, message: "no output node"},
		{name: "two outputs", graph: func(g *Graph) *Graph { g.Ops[2] = OpOutput; return g }, code: ErrInvalidGraph, message: "nodes 2 and 3 are both output"},
		{name: "output not last", graph: func(g *Graph) *Graph {
			g.Ops[2], g.Ops[3] = OpOutput, OpCallFunction
			return g
		}, code: ErrInvalidGraph, message: "output node 2 is not the last"},
		{name: "negative bytes", graph: func(g *Graph) *Graph { g.Params[0].Bytes = -1; return g }, code: ErrInvalidGraph, message: `parameter 0 ("fc.weight"): Bytes is negative`},
		{name: "negative storage bytes", graph: func(g *Graph) *Graph { g.Params[0].StorageBytes = -1; return g }, code: ErrInvalidGraph, message: "StorageBytes is negative"},

		// Byte sums.
		{name: "ddp total overflows", graph: overflowGraph, code: ErrOverflow, message: "overflow"},
		{name: "torch bucket overflows", graph: overflowGraph, cfg: func(c *Config) { c.Mode = ModeTorch }, code: ErrOverflow, message: `"b"`},
		{name: "torch repeated use overflows", graph: func(*Graph) *Graph {
			b := &graphBuilder{}
			w := b.param("w", math.MaxInt64/2+1)
			x := b.placeholder("x")
			lin := b.call("twice", in(x), arg(w), arg(w))
			b.output(lin)
			return b.graph()
		}, cfg: func(c *Config) {
			c.Mode = ModeTorch
			c.BucketCapBytes = math.MaxInt64
			c.FirstBucketCapBytes = math.MaxInt64
		}, code: ErrOverflow, message: "overflow"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := validGraph()
			if tc.graph != nil {
				g = tc.graph(g)
			}
			cfg := okCfg
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			pl, err := Build(g, cfg)
			require.Error(t, err, "want error code %d", tc.code)
			var perr *Error
			require.ErrorAs(t, err, &perr)
			assert.Equal(t, tc.code, perr.Code, perr.Msg)
			assert.Contains(t, perr.Msg, tc.message)
			assert.Nil(t, pl, "plan returned alongside an error")
		})
	}
}

// overflowGraph uses two parameters whose bytes sum past int64.
func overflowGraph(*Graph) *Graph {
	b := &graphBuilder{}
	wa := b.param("a", math.MaxInt64-10)
	wb := b.param("b", 11)
	x := b.placeholder("x")
	lin := b.call("linear", in(x), arg(wa), arg(wb))
	b.output(lin)
	return b.graph()
}

// TestBuildAcceptsEdgeInputs covers inputs that look odd but are valid.
func TestBuildAcceptsEdgeInputs(t *testing.T) {
	cases := []struct {
		name  string
		graph func() *Graph
	}{
		{"output only", func() *Graph {
			return &Graph{Ops: []OpKind{OpOutput}, ModuleIDs: []int32{-1}, ParamOffsets: []int64{0, 0}, UserOffsets: []int64{0, 0}}
		}},
		{"sum near int64 max", func() *Graph {
			b := &graphBuilder{}
			w := b.param("big", math.MaxInt64-1)
			v := b.param("one", 1)
			x := b.placeholder("x")
			b.output(b.call("lin", in(x), arg(w), arg(v)))
			return b.graph()
		}},
		{"sparse module ids", func() *Graph {
			b := &graphBuilder{}
			w := b.param("w", 10)
			x := b.placeholder("x")
			m1 := b.node("m1", OpCallModule, math.MaxInt32, in(x), module(w))
			m2 := b.node("m2", OpCallModule, math.MaxInt32, in(m1), module(w))
			b.output(m2)
			return b.graph()
		}},
		{"refs on placeholder and output are ignored", func() *Graph {
			b := &graphBuilder{}
			w := b.param("w", 10)
			x := b.node("x", OpPlaceholder, -1, nil, arg(w))
			lin := b.call("lin", in(x), arg(w))
			b.node("output", OpOutput, -1, in(lin), other(w))
			return b.graph()
		}},
		{"placeholder between compute nodes", func() *Graph {
			b := &graphBuilder{}
			w := b.param("w", 10)
			v := b.param("v", 10)
			x := b.placeholder("x")
			a := b.call("a", in(x), arg(w))
			y := b.placeholder("y")
			c := b.call("c", in(a, y), arg(v))
			b.output(c)
			return b.graph()
		}},
	}
	for _, tc := range cases {
		for _, mode := range []Mode{ModeDDP, ModeTorch} {
			cfg := Config{Mode: mode, BucketCapBytes: 10, FirstBucketCapBytes: 10}
			g := tc.graph()
			pl, err := Build(g, cfg)
			if !assert.NoError(t, err, "%s, mode %d", tc.name, mode) {
				continue
			}
			assert.Empty(t, checkPlan(g, cfg, pl), "%s, mode %d", tc.name, mode)
		}
	}
}

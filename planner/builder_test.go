package planner

import (
	"fmt"
	"strings"
)

// graphBuilder assembles test graphs node by node and keeps node names for
// readable golden files. Users are derived from each node's inputs.
type graphBuilder struct {
	ops     []OpKind
	modules []int32
	refs    [][]paramRef
	users   [][]int32
	names   []string
	params  []Param
}

type paramRef struct {
	param int32
	kind  RefKind
}

// paramOpt adjusts a parameter as it is declared.
type paramOpt func(*Param)

func frozen(p *Param)  { p.RequiresGrad = false }
func ignored(p *Param) { p.Ignored = true }
func dtype(code int32) paramOpt {
	return func(p *Param) { p.DType = code }
}
func storage(bytes int64) paramOpt {
	return func(p *Param) { p.StorageBytes = bytes }
}

// param declares a trainable parameter whose storage is exactly its bytes.
func (b *graphBuilder) param(name string, bytes int64, opts ...paramOpt) int32 {
	p := Param{Name: name, Bytes: bytes, StorageBytes: bytes, RequiresGrad: true}
	for _, o := range opts {
		o(&p)
	}
	b.params = append(b.params, p)
	return int32(len(b.params) - 1)
}

// node appends a node that reads inputs and refers to refs, and returns its
// index.
func (b *graphBuilder) node(name string, op OpKind, module int32, inputs []int, refs ...paramRef) int {
	i := len(b.ops)
	b.ops = append(b.ops, op)
	b.modules = append(b.modules, module)
	b.refs = append(b.refs, refs)
	b.users = append(b.users, nil)
	b.names = append(b.names, name)
	for _, in := range inputs {
		b.users[in] = append(b.users[in], int32(i))
	}
	return i
}

func (b *graphBuilder) placeholder(name string) int {
	return b.node(name, OpPlaceholder, -1, nil)
}

func (b *graphBuilder) call(name string, inputs []int, refs ...paramRef) int {
	return b.node(name, OpCallFunction, -1, inputs, refs...)
}

func (b *graphBuilder) output(inputs ...int) int {
	return b.node("output", OpOutput, -1, inputs)
}

func arg(p int32) paramRef    { return paramRef{p, RefArg} }
func module(p int32) paramRef { return paramRef{p, RefModule} }
func attr(p int32) paramRef   { return paramRef{p, RefAttr} }
func other(p int32) paramRef  { return paramRef{p, RefOther} }

func in(nodes ...int) []int { return nodes }

// graph flattens the builder into a Graph.
func (b *graphBuilder) graph() *Graph {
	n := len(b.ops)
	g := &Graph{
		Ops:          append([]OpKind(nil), b.ops...),
		ModuleIDs:    append([]int32(nil), b.modules...),
		ParamOffsets: make([]int64, n+1),
		UserOffsets:  make([]int64, n+1),
		Params:       append([]Param(nil), b.params...),
	}
	for i := range n {
		for _, r := range b.refs[i] {
			g.ParamIndex = append(g.ParamIndex, r.param)
			g.ParamRefs = append(g.ParamRefs, r.kind)
		}
		g.ParamOffsets[i+1] = int64(len(g.ParamIndex))
		g.Users = append(g.Users, b.users[i]...)
		g.UserOffsets[i+1] = int64(len(g.Users))
	}
	return g
}

// render writes a plan in a stable, readable text form for golden files.
func render(g *Graph, names []string, cfg Config, pl *Plan) string {
	var s strings.Builder
	mode := "ddp"
	if cfg.Mode == ModeTorch {
		mode = "torch"
	}
	align := ""
	if cfg.AlignBuckets {
		align = " align_buckets=true"
	}
	fmt.Fprintf(&s, "config: mode=%s cap=%d first=%d caps=%v max_pieces=%d%s\n",
		mode, cfg.BucketCapBytes, cfg.FirstBucketCapBytes, cfg.BucketCapsBytes, cfg.MaxPieces, align)
	nodeList := func(nodes []int32) string {
		parts := make([]string, len(nodes))
		for k, i := range nodes {
			parts[k] = names[i]
		}
		return "[" + strings.Join(parts, " ") + "]"
	}
	fmt.Fprintf(&s, "pieces: %d\n", pl.NumPieces)
	for p := range pl.NumPieces {
		var members []int32
		for i, q := range pl.NodePiece {
			if int(q) == p {
				members = append(members, int32(i))
			}
		}
		fmt.Fprintf(&s, "piece %d: %s\n  inputs: %s\n  outputs: %s\n",
			p, nodeList(members), nodeList(pl.PieceInputs[p]), nodeList(pl.PieceOutputs[p]))
	}
	fmt.Fprintf(&s, "buckets: %d\n", len(pl.Buckets))
	for k, b := range pl.Buckets {
		params := make([]string, len(b.Params))
		for j, p := range b.Params {
			params[j] = g.Params[p].Name
		}
		fmt.Fprintf(&s, "bucket %d: bytes=%d piece=%d nodes=[%s..%s] extended=%t dtype=%d device=%d\n  params: [%s]\n",
			k, b.Bytes, b.Piece, names[b.NodeBegin], names[b.NodeEnd-1], b.Extended, b.DType, b.Device,
			strings.Join(params, " "))
	}
	fmt.Fprintf(&s, "fingerprint: %#016x\n", pl.Fingerprint)
	return s.String()
}

// nodeIndex returns the index of the node called name; tests use it to
// state expectations by name.
func (b *graphBuilder) nodeIndex(name string) int {
	for i, nm := range b.names {
		if nm == name {
			return i
		}
	}
	panic("no node named " + name)
}

// paramIndex returns the index of the parameter called name.
func (b *graphBuilder) paramIndex(name string) int32 {
	for p := range b.params {
		if b.params[p].Name == name {
			return int32(p)
		}
	}
	panic("no parameter named " + name)
}

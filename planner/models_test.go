package planner

import "fmt"

// Test models. Sizes are in bytes; fp32 unless stated.

const (
	mib = 1 << 20
	f32 = 4
)

// linearLayer describes one nn.Linear for linearStack.
type linearLayer struct {
	in, out int64
	dtype   int32
}

// linearStack builds the graph Dynamo produces for a stack of nn.Linear
// layers with ReLU between them when parameters are inlined as
// placeholders: placeholder x, then a weight and a bias placeholder per
// layer, then linear(h, w, b) call_function nodes (RefArg w, b) and relu.
func linearStack(elemBytes int64, layers ...linearLayer) *graphBuilder {
	b := &graphBuilder{}
	x := b.placeholder("x")
	type layerParams struct {
		w, b             int32 // parameter indices
		wHolder, bHolder int   // their placeholder nodes
	}
	ps := make([]layerParams, len(layers))
	for l, ly := range layers {
		name := fmt.Sprintf("fc%d", l+1)
		ps[l].w = b.param(name+".weight", ly.in*ly.out*elemBytes, dtype(ly.dtype))
		ps[l].b = b.param(name+".bias", ly.out*elemBytes, dtype(ly.dtype))
		ps[l].wHolder = b.placeholder("l_" + name + "_weight")
		ps[l].bHolder = b.placeholder("l_" + name + "_bias")
	}
	h := x
	for l, p := range ps {
		h = b.call(fmt.Sprintf("linear%d", l+1), in(h, p.wHolder, p.bHolder), arg(p.w), arg(p.b))
		if l+1 < len(layers) {
			h = b.call(fmt.Sprintf("relu%d", l+1), in(h))
		}
	}
	b.output(h)
	return b
}

// toyModel is the 10 -> 5000 -> 5000 -> 5000 -> 5 Linear stack of torch's
// DDPOptimizer tests.
func toyModel() *graphBuilder {
	return linearStack(f32,
		linearLayer{in: 10, out: 5000},
		linearLayer{in: 5000, out: 5000},
		linearLayer{in: 5000, out: 5000},
		linearLayer{in: 5000, out: 5})
}

// mlpModel is a 10 -> 100 -> 100 -> 100 -> 5 Linear stack with ReLU:
// weights 4000, 40000, 40000 and 2000 bytes, biases 400, 400, 400 and 20.
func mlpModel() *graphBuilder {
	return linearStack(f32,
		linearLayer{in: 10, out: 100},
		linearLayer{in: 100, out: 100},
		linearLayer{in: 100, out: 100},
		linearLayer{in: 100, out: 5})
}

// sharedWeightModel ties the embedding and the head, as language models do:
// W is used first by embed and again by head.
func sharedWeightModel() *graphBuilder {
	b := &graphBuilder{}
	W := b.param("embed.weight", 4000)
	mw := b.param("mid.weight", 1000)
	mb := b.param("mid.bias", 100)
	x := b.placeholder("x")
	pW := b.placeholder("l_embed_weight")
	pmw := b.placeholder("l_mid_weight")
	pmb := b.placeholder("l_mid_bias")
	embed := b.call("embed", in(x, pW), arg(W))
	mid := b.call("mid", in(embed, pmw, pmb), arg(mw), arg(mb))
	relu := b.call("relu", in(mid))
	head := b.call("head", in(relu, pW), arg(W))
	b.output(head)
	return b
}

// ignoredParamModel has three layers; fc2.weight is excluded from DDP and
// fc3.bias is frozen, so neither may be counted.
func ignoredParamModel() *graphBuilder {
	b := &graphBuilder{}
	x := b.placeholder("x")
	var prev = x
	for l, opts := range [][2][]paramOpt{{nil, nil}, {{ignored}, nil}, {nil, {frozen}}} {
		name := fmt.Sprintf("fc%d", l+1)
		w := b.param(name+".weight", 1000, opts[0]...)
		bias := b.param(name+".bias", 100, opts[1]...)
		pw, pb := b.placeholder("l_"+name+"_weight"), b.placeholder("l_"+name+"_bias")
		prev = b.call("linear"+fmt.Sprint(l+1), in(prev, pw, pb), arg(w), arg(bias))
	}
	b.output(prev)
	return b
}

// preambleModel starts with parameter-free ops before its first linear.
func preambleModel() *graphBuilder {
	b := &graphBuilder{}
	w1 := b.param("fc1.weight", 1000)
	w2 := b.param("fc2.weight", 1000)
	x := b.placeholder("x")
	p1, p2 := b.placeholder("l_fc1_weight"), b.placeholder("l_fc2_weight")
	mul := b.call("mul", in(x))
	add := b.call("add", in(mul, x))
	l1 := b.call("linear1", in(add, p1), arg(w1))
	l2 := b.call("linear2", in(l1, p2), arg(w2))
	b.output(l2)
	return b
}

// inplaceTailModel ends with an in-place update that nothing reads (its
// effect is the mutation), and that update uses a large parameter, so the
// last bucket must grow past its cap to gain an output.
func inplaceTailModel() *graphBuilder {
	b := &graphBuilder{}
	w1 := b.param("fc1.weight", 1000)
	w2 := b.param("fc2.weight", 1000)
	w3 := b.param("scale", 2000)
	x := b.placeholder("x")
	buf := b.placeholder("buf")
	p1, p2, p3 := b.placeholder("l_fc1_weight"), b.placeholder("l_fc2_weight"), b.placeholder("l_scale")
	l1 := b.call("linear1", in(x, p1), arg(w1))
	l2 := b.call("linear2", in(l1, p2), arg(w2))
	b.node("addcmul_", OpCallMethod, -1, in(buf, l1, p3), arg(w3))
	b.output(l2)
	return b
}

// moduleModel is an older-style graph: call_module nodes (module 0 called
// twice), a get_attr parameter, and a call_function that uses it.
func moduleModel() *graphBuilder {
	b := &graphBuilder{}
	w1 := b.param("fc1.weight", 4000)
	b1 := b.param("fc1.bias", 100)
	w2 := b.param("fc2.weight", 4000)
	b2 := b.param("fc2.bias", 100)
	s := b.param("scale", 50)
	x := b.placeholder("x")
	fc1a := b.node("fc1_a", OpCallModule, 0, in(x), module(w1), module(b1))
	relu := b.call("relu", in(fc1a))
	fc2 := b.node("fc2", OpCallModule, 1, in(relu), module(w2), module(b2))
	scale := b.node("scale", OpGetAttr, -1, nil, attr(s))
	mul := b.call("mul", in(fc2, scale))
	fc1b := b.node("fc1_b", OpCallModule, 0, in(mul), module(w1), module(b1))
	b.output(fc1b)
	return b
}

// mixedDTypeModel alternates fp32 (dtype 0) and bf16 (dtype 1) layers of
// 1000-byte weights, without biases.
func mixedDTypeModel() *graphBuilder {
	b := &graphBuilder{}
	x := b.placeholder("x")
	prev := x
	for l := range 4 {
		name := fmt.Sprintf("fc%d", l+1)
		w := b.param(name+".weight", 1000, dtype(int32(l%2)))
		pw := b.placeholder("l_" + name + "_weight")
		prev = b.call("linear"+fmt.Sprint(l+1), in(prev, pw), arg(w))
	}
	b.output(prev)
	return b
}

// chainModel is a chain of linear layers without ReLU whose weights have the
// given sizes and, when biasBytes > 0, biases of that size.
func chainModel(biasBytes int64, weightBytes ...int64) *graphBuilder {
	b := &graphBuilder{}
	x := b.placeholder("x")
	prev := x
	for l, wBytes := range weightBytes {
		name := fmt.Sprintf("fc%d", l+1)
		refs := []paramRef{arg(b.param(name+".weight", wBytes))}
		inputs := in(prev, b.placeholder("l_"+name+"_weight"))
		if biasBytes > 0 {
			refs = append(refs, arg(b.param(name+".bias", biasBytes)))
			inputs = append(inputs, b.placeholder("l_"+name+"_bias"))
		}
		prev = b.call("linear"+fmt.Sprint(l+1), inputs, refs...)
	}
	b.output(prev)
	return b
}

// noComputeModel only passes its input through.
func noComputeModel() *graphBuilder {
	b := &graphBuilder{}
	b.param("unused", 100)
	x := b.placeholder("x")
	b.output(x)
	return b
}

// deadHeadModel starts with a node whose result nothing reads (an in-place
// update) and that alone uses a parameter, so a piece holding just that
// node would have no output.
func deadHeadModel() *graphBuilder {
	b := &graphBuilder{}
	w1 := b.param("stat.weight", 100)
	w2 := b.param("fc.weight", 100)
	x := b.placeholder("x")
	p1, p2 := b.placeholder("l_stat_weight"), b.placeholder("l_fc_weight")
	b.node("update_", OpCallMethod, -1, in(x, p1), arg(w1))
	lin := b.call("linear", in(x, p2), arg(w2))
	b.output(lin)
	return b
}

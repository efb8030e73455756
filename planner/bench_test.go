package planner

import (
	"fmt"
	"testing"
)

// syntheticGraph builds a transformer-like MLP chain of about n nodes as
// Dynamo emits it with inlined parameters: one placeholder per parameter,
// then per block
//
//	up = linear(h, w1, b1); act = relu(up); down = linear(act, w2, b2);
//	res = add(down, h); h = layer_norm(res, g)
//
// so every block has a residual edge and five parameters over five compute
// nodes. Weights are 1 MiB and biases and norm scales 2 KiB, fp32.
func syntheticGraph(n int) *Graph {
	blocks := max((n-2)/10, 1)
	const perBlock = 5
	numPlaceholders := 1 + perBlock*blocks
	total := numPlaceholders + perBlock*blocks + 1
	g := &Graph{
		Ops:          make([]OpKind, total),
		ModuleIDs:    make([]int32, total),
		ParamOffsets: make([]int64, total+1),
		UserOffsets:  make([]int64, total+1),
		Params:       make([]Param, perBlock*blocks),
	}
	for p := range g.Params {
		bytes := int64(2048)
		if p%perBlock == 0 || p%perBlock == 2 {
			bytes = 512 * 512 * 4
		}
		g.Params[p] = Param{Name: fmt.Sprintf("blocks.%d.p%d", p/perBlock, p%perBlock),
			Bytes: bytes, StorageBytes: bytes, RequiresGrad: true}
	}
	users := make([][]int32, total)
	refs := make([][]int32, total)
	for i := range g.ModuleIDs {
		g.ModuleIDs[i] = -1
	}
	// Placeholders: x, then the parameters in order.
	paramHolder := func(p int) int { return 1 + p }
	node := numPlaceholders
	h := 0
	call := func(inputs []int, params ...int) int {
		i := node
		node++
		g.Ops[i] = OpCallFunction
		for _, in := range inputs {
			users[in] = append(users[in], int32(i))
		}
		for _, p := range params {
			users[paramHolder(p)] = append(users[paramHolder(p)], int32(i))
			refs[i] = append(refs[i], int32(p))
		}
		return i
	}
	for blk := range blocks {
		p := blk * perBlock
		up := call([]int{h}, p, p+1)
		act := call([]int{up})
		down := call([]int{act}, p+2, p+3)
		res := call([]int{down, h})
		h = call([]int{res}, p+4)
	}
	g.Ops[total-1] = OpOutput
	users[h] = append(users[h], int32(total-1))
	for i := range total {
		for _, p := range refs[i] {
			g.ParamIndex = append(g.ParamIndex, p)
			g.ParamRefs = append(g.ParamRefs, RefArg)
		}
		g.ParamOffsets[i+1] = int64(len(g.ParamIndex))
		g.Users = append(g.Users, users[i]...)
		g.UserOffsets[i+1] = int64(len(g.Users))
	}
	return g
}

func BenchmarkBuild(b *testing.B) {
	for _, mode := range []struct {
		name string
		mode Mode
	}{{"ddp", ModeDDP}, {"torch", ModeTorch}} {
		for _, size := range []struct {
			name  string
			nodes int
		}{{"1k", 1_000}, {"10k", 10_000}, {"100k", 100_000}, {"1M", 1_000_000}} {
			g := syntheticGraph(size.nodes)
			cfg := Config{Mode: mode.mode, BucketCapBytes: 25 * mib, FirstBucketCapBytes: 1 * mib}
			b.Run(mode.name+"/"+size.name, func(b *testing.B) {
				b.ReportAllocs()
				iterations := 0
				for b.Loop() {
					if _, err := Build(g, cfg); err != nil {
						b.Fatal(err)
					}
					iterations++
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(iterations*len(g.Ops)), "ns/node")
			})
		}
	}
}

// TestSyntheticGraphPlans keeps the benchmark graph honest: it must be valid
// and cut into many pieces in both modes.
func TestSyntheticGraphPlans(t *testing.T) {
	g := syntheticGraph(10_000)
	for _, mode := range []Mode{ModeDDP, ModeTorch} {
		cfg := Config{Mode: mode, BucketCapBytes: 25 * mib, FirstBucketCapBytes: 1 * mib}
		pl, err := Build(g, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if pl.NumPieces < 10 {
			t.Errorf("mode %d: only %d pieces", mode, pl.NumPieces)
		}
		for _, v := range checkPlan(g, cfg, pl) {
			t.Errorf("mode %d: %s", mode, v)
		}
	}
}

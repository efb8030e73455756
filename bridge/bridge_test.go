package main

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/goddp/goddp/planner"
)

// toyGraph is a model of three Linear(width, width) fp32 layers with ReLU:
// placeholders x, w0, b0, w1, b1, w2, b2 (nodes 0-6), then linear_i (7+2i)
// reading x or the previous relu plus w_i and b_i, relu_i (8+2i), and the
// output (13). Parameters reach the linear nodes as positional placeholders.
func toyGraph(width int64) *rawGraph {
	const layers = 3
	g := &rawGraph{NumNodes: 7 + 2*layers + 1, NumParams: 2 * layers}
	n := g.NumNodes
	users := make([][]int32, n)
	params := make([][]int32, n)
	g.NodeOps = make([]int32, n)
	g.NodeModuleIDs = make([]int32, n)
	for i := range g.NodeModuleIDs {
		g.NodeModuleIDs[i] = -1
	}
	for i := 0; i < 7; i++ {
		g.NodeOps[i] = int32(planner.OpPlaceholder)
	}
	prev := int32(0) // x
	for l := int32(0); l < layers; l++ {
		linear, relu := 7+2*l, 8+2*l
		w, b := 1+2*l, 2+2*l // placeholder node indices
		g.NodeOps[linear] = int32(planner.OpCallFunction)
		g.NodeOps[relu] = int32(planner.OpCallFunction)
		params[linear] = []int32{2 * l, 2*l + 1}
		users[prev] = append(users[prev], linear)
		users[w] = append(users[w], linear)
		users[b] = append(users[b], linear)
		users[linear] = append(users[linear], relu)
		prev = relu
	}
	g.NodeOps[n-1] = int32(planner.OpOutput)
	users[prev] = append(users[prev], int32(n-1))

	g.NodeParamOffsets = []int64{0}
	g.NodeUserOffsets = []int64{0}
	for i := range n {
		g.NodeParams = append(g.NodeParams, params[i]...)
		for range params[i] {
			g.NodeParamRefs = append(g.NodeParamRefs, uint8(planner.RefArg))
		}
		g.NodeParamOffsets = append(g.NodeParamOffsets, int64(len(g.NodeParams)))
		g.NodeUsers = append(g.NodeUsers, users[i]...)
		g.NodeUserOffsets = append(g.NodeUserOffsets, int64(len(g.NodeUsers)))
	}
	g.ParamNameOffsets = []int64{0}
	for l := range layers {
		for _, kind := range []string{"weight", "bias"} {
			size := 4 * width
			if kind == "weight" {
				size *= width
			}
			g.ParamBytes = append(g.ParamBytes, size)
			g.ParamStorageBytes = append(g.ParamStorageBytes, size)
			g.ParamDtypes = append(g.ParamDtypes, 7)
			g.ParamDevices = append(g.ParamDevices, 0)
			g.ParamFlags = append(g.ParamFlags, 1) // GODDP_PARAM_REQUIRES_GRAD
			g.ParamNames = append(g.ParamNames, fmt.Sprintf("layers.%d.%s", l, kind)...)
			g.ParamNameOffsets = append(g.ParamNameOffsets, int64(len(g.ParamNames)))
		}
	}
	return g
}

func toyConfig(mode planner.Mode) *rawConfig {
	return &rawConfig{Mode: int32(mode), BucketCapBytes: 4_000_000, FirstBucketCapBytes: 1_000_000}
}

func TestABIVersion(t *testing.T) {
	if got := callABIVersion(); got != 3 {
		t.Fatalf("goddp_abi_version() = %d, want 3 (GODDP_ABI_VERSION)", got)
	}
}

func TestStatusMapping(t *testing.T) {
	cases := []struct {
		err  error
		want int
	}{
		{nil, statusOK},
		{&planner.Error{Code: planner.ErrInvalidConfig, Msg: "cap"}, statusInvalidConfig},
		{&planner.Error{Code: planner.ErrInvalidGraph, Msg: "edge"}, statusInvalidGraph},
		{&planner.Error{Code: planner.ErrOverflow, Msg: "sum"}, statusOverflow},
		{fmt.Errorf("wrapped: %w", &planner.Error{Code: planner.ErrInvalidGraph}), statusInvalidGraph},
		{&planner.Error{Code: 99, Msg: "unknown code"}, statusInternal},
		{errors.New("plain"), statusInternal},
		{errOutOfMemory, statusInternal},
	}
	for _, c := range cases {
		if got := statusOfInt(c.err); got != c.want {
			t.Errorf("statusOf(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

func TestSetMaxProcs(t *testing.T) {
	st, orig := callSetMaxProcs(0)
	if st != statusOK || orig < 1 {
		t.Fatalf("query: status %d, value %d", st, orig)
	}
	defer callSetMaxProcs(orig)
	if st, prev := callSetMaxProcs(3); st != statusOK || prev != orig {
		t.Fatalf("set 3: status %d, previous %d, want %d", st, prev, orig)
	}
	if st, prev := callSetMaxProcs(-5); st != statusOK || prev != 3 {
		t.Fatalf("negative only queries: status %d, value %d, want 3", st, prev)
	}
	if st, prev := callSetMaxProcs(0); st != statusOK || prev != 3 {
		t.Fatalf("query after set: status %d, value %d", st, prev)
	}
}

func TestFreeNilIsNoop(t *testing.T) {
	callPlanFreeNil()
	callStringFreeNil()
}

func TestConvertGraph(t *testing.T) {
	raw := toyGraph(1000)
	// A non-ASCII name and an ignored, frozen parameter exercise the
	// name slicing and the flag bits.
	raw.ParamNames = append(raw.ParamNames[:raw.ParamNameOffsets[5]], "layers.2.bïas"...)
	raw.ParamNameOffsets[6] = int64(len(raw.ParamNames))
	raw.ParamFlags[3] = 2 // ignored, no grad
	raw.ParamBytes[4] = 12345
	raw.ParamStorageBytes[4] = 23456
	raw.ParamDevices[4] = 3
	raw.NodeModuleIDs[9] = 42

	g, err := convertGraphViaC(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Ops) != 14 || g.Ops[0] != planner.OpPlaceholder || g.Ops[7] != planner.OpCallFunction || g.Ops[13] != planner.OpOutput {
		t.Errorf("ops = %v", g.Ops)
	}
	if !reflect.DeepEqual(g.ModuleIDs, raw.NodeModuleIDs) {
		t.Errorf("module ids = %v, want %v", g.ModuleIDs, raw.NodeModuleIDs)
	}
	if !reflect.DeepEqual(g.ParamOffsets, raw.NodeParamOffsets) || !reflect.DeepEqual(g.ParamIndex, raw.NodeParams) {
		t.Errorf("node params = %v %v", g.ParamOffsets, g.ParamIndex)
	}
	if len(g.ParamRefs) != 6 || g.ParamRefs[5] != planner.RefArg {
		t.Errorf("refs = %v", g.ParamRefs)
	}
	if !reflect.DeepEqual(g.UserOffsets, raw.NodeUserOffsets) || !reflect.DeepEqual(g.Users, raw.NodeUsers) {
		t.Errorf("users = %v %v", g.UserOffsets, g.Users)
	}
	want := []planner.Param{
		{Name: "layers.0.weight", Bytes: 4_000_000, StorageBytes: 4_000_000, DType: 7, RequiresGrad: true},
		{Name: "layers.0.bias", Bytes: 4000, StorageBytes: 4000, DType: 7, RequiresGrad: true},
		{Name: "layers.1.weight", Bytes: 4_000_000, StorageBytes: 4_000_000, DType: 7, RequiresGrad: true},
		{Name: "layers.1.bias", Bytes: 4000, StorageBytes: 4000, DType: 7, Ignored: true},
		{Name: "layers.2.weight", Bytes: 12345, StorageBytes: 23456, DType: 7, Device: 3, RequiresGrad: true},
		{Name: "layers.2.bïas", Bytes: 4000, StorageBytes: 4000, DType: 7, RequiresGrad: true},
	}
	if !reflect.DeepEqual(g.Params, want) {
		t.Errorf("params:\n got %+v\nwant %+v", g.Params, want)
	}
}

func TestConvertConfig(t *testing.T) {
	cfg, err := convertConfigViaC(&rawConfig{Mode: 1, BucketCapBytes: 10, FirstBucketCapBytes: 5,
		NumBucketCaps: 2, BucketCapsBytes: []int64{7, 9}, MaxPieces: 4, AlignBuckets: -3})
	if err != nil {
		t.Fatal(err)
	}
	want := planner.Config{Mode: planner.ModeTorch, BucketCapBytes: 10, FirstBucketCapBytes: 5,
		BucketCapsBytes: []int64{7, 9}, MaxPieces: 4, AlignBuckets: true}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("config = %+v, want %+v", cfg, want)
	}
	cfg, err = convertConfigViaC(&rawConfig{BucketCapBytes: 10, FirstBucketCapBytes: 5})
	if err != nil || cfg.BucketCapsBytes != nil || cfg.AlignBuckets {
		t.Errorf("no per-bucket caps, not aligned: %+v, %v", cfg, err)
	}
}

// TestBadPointersAndLengths covers the checks the bridge itself makes before
// it reads caller memory: each must fail with the right status, a message
// naming the field, and *out left NULL.
func TestBadPointersAndLengths(t *testing.T) {
	cases := []struct {
		name    string
		edit    func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig)
		status  int
		message string
	}{
		{"null graph", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { return nil, c }, statusInvalidGraph, "graph is NULL"},
		{"null config", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { return g, nil }, statusInvalidConfig, "config is NULL"},
		{"negative num_nodes", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NumNodes = -1; return g, c }, statusInvalidGraph, "num_nodes"},
		{"huge num_nodes", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NumNodes = 1 << 40; return g, c }, statusInvalidGraph, "num_nodes"},
		{"negative num_params", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NumParams = -3; return g, c }, statusInvalidGraph, "num_params"},
		{"null node_ops", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NodeOps = nil; return g, c }, statusInvalidGraph, "node_ops is NULL"},
		{"null node_module_ids", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NodeModuleIDs = nil; return g, c }, statusInvalidGraph, "node_module_ids is NULL"},
		{"null node_param_offsets", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NodeParamOffsets = nil; return g, c }, statusInvalidGraph, "node_param_offsets is NULL"},
		{"negative last param offset", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) {
			g.NodeParamOffsets[g.NumNodes] = -2
			return g, c
		}, statusInvalidGraph, "node_param_offsets[14]"},
		{"null node_params", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NodeParams = nil; return g, c }, statusInvalidGraph, "node_params is NULL"},
		{"null node_param_refs", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NodeParamRefs = nil; return g, c }, statusInvalidGraph, "node_param_refs is NULL"},
		{"null node_users", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NodeUsers = nil; return g, c }, statusInvalidGraph, "node_users is NULL"},
		{"null param_bytes", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.ParamBytes = nil; return g, c }, statusInvalidGraph, "param_bytes is NULL"},
		{"null param_flags", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.ParamFlags = nil; return g, c }, statusInvalidGraph, "param_flags is NULL"},
		{"null param_names", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.ParamNames = nil; return g, c }, statusInvalidGraph, "param_names is NULL"},
		{"name offsets backwards", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.ParamNameOffsets[2] = 1; return g, c }, statusInvalidGraph, "param_name_offsets[1:3]"},
		{"unknown flag bit", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.ParamFlags[4] = 0x10; return g, c }, statusInvalidGraph, "param_flags[4]"},
		{"negative num_bucket_caps", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { c.NumBucketCaps = -1; return g, c }, statusInvalidConfig, "bucket_caps_bytes: negative length"},
		{"null bucket caps", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { c.NumBucketCaps = 2; return g, c }, statusInvalidConfig, "bucket_caps_bytes is NULL"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, cfg := c.edit(toyGraph(1000), toyConfig(planner.ModeDDP))
			res := callPlanGraph(g, cfg, false)
			if res.Status != c.status || !strings.Contains(res.Msg, c.message) {
				t.Errorf("got status %d message %q; want status %d with %q", res.Status, res.Msg, c.status, c.message)
			}
			if !res.OutNull {
				t.Errorf("*out not NULL after a failure")
			}
		})
	}
	t.Run("null out", func(t *testing.T) {
		res := callPlanGraph(toyGraph(1000), toyConfig(planner.ModeDDP), true)
		if res.Status != statusInvalidConfig || !strings.Contains(res.Msg, "out is NULL") {
			t.Errorf("got %d %q", res.Status, res.Msg)
		}
	})
}

// TestBridgeMatchesPlanner checks the round trip through C: whatever
// planner.Build returns for the toy graph, success or error, the export
// must return the same thing.
func TestBridgeMatchesPlanner(t *testing.T) {
	for _, tc := range []struct {
		mode  planner.Mode
		align int32
	}{{planner.ModeDDP, 0}, {planner.ModeTorch, 0}, {planner.ModeDDP, 1}, {planner.ModeTorch, 1}} {
		mode := tc.mode
		t.Run(fmt.Sprintf("mode%d_align%d", mode, tc.align), func(t *testing.T) {
			raw, rawCfg := toyGraph(1000), toyConfig(mode)
			if tc.align != 0 {
				// Caps that split each layer's bias from its weight, so the
				// predicted buckets outnumber the pieces and alignment shows.
				rawCfg.AlignBuckets = tc.align
				rawCfg.BucketCapBytes, rawCfg.FirstBucketCapBytes = 4_000_000, 4_000
			}
			g, err := convertGraphViaC(raw)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := convertConfigViaC(rawCfg)
			if err != nil {
				t.Fatal(err)
			}
			want, wantErr := planner.Build(g, cfg)
			res := callPlanGraph(raw, rawCfg, false)
			if wantErr != nil {
				if res.Status != statusOfInt(wantErr) || res.Msg != wantErr.Error() || !res.OutNull {
					t.Fatalf("bridge: status %d %q; planner: status %d %q", res.Status, res.Msg, statusOfInt(wantErr), wantErr)
				}
				return
			}
			if res.Status != statusOK || res.Plan == nil {
				t.Fatalf("bridge failed: %d %q", res.Status, res.Msg)
			}
			got := res.Plan
			// DType and Device are not part of the C plan.
			for i := range want.Buckets {
				want.Buckets[i].DType, want.Buckets[i].Device = 0, 0
			}
			if got.Fingerprint != want.Fingerprint || got.NumPieces != want.NumPieces ||
				!reflect.DeepEqual(got.NodePiece, want.NodePiece) {
				t.Errorf("plan header differs:\n got %+v\nwant %+v", got, want)
			}
			if !reflect.DeepEqual(got.Buckets, want.Buckets) {
				t.Errorf("buckets differ:\n got %+v\nwant %+v", got.Buckets, want.Buckets)
			}
			if !equalLists(got.PieceInputs, want.PieceInputs) || !equalLists(got.PieceOutputs, want.PieceOutputs) {
				t.Errorf("crossing values differ:\n got %v / %v\nwant %v / %v",
					got.PieceInputs, got.PieceOutputs, want.PieceInputs, want.PieceOutputs)
			}
		})
	}
}

// TestAlignBucketsThroughC: align_buckets crosses the ABI. The toy graph
// with caps that close one bucket per bias and one per weight has four
// predicted buckets over three pieces; aligned, it has one bucket per piece
// holding that layer's weight and bias. torch mode refuses the option.
func TestAlignBucketsThroughC(t *testing.T) {
	cfg := toyConfig(planner.ModeDDP)
	cfg.BucketCapBytes, cfg.FirstBucketCapBytes = 4_000_000, 4_000
	plain := callPlanGraph(toyGraph(1000), cfg, false)
	cfg.AlignBuckets = 1
	aligned := callPlanGraph(toyGraph(1000), cfg, false)
	if plain.Status != statusOK || aligned.Status != statusOK {
		t.Fatalf("status %d %q / %d %q", plain.Status, plain.Msg, aligned.Status, aligned.Msg)
	}
	if plain.Plan.NumPieces != 3 || len(plain.Plan.Buckets) != 4 {
		t.Fatalf("unaligned: %d pieces, %d buckets; want 3, 4", plain.Plan.NumPieces, len(plain.Plan.Buckets))
	}
	if aligned.Plan.NumPieces != 3 || len(aligned.Plan.Buckets) != 3 {
		t.Fatalf("aligned: %d pieces, %d buckets; want 3, 3", aligned.Plan.NumPieces, len(aligned.Plan.Buckets))
	}
	for k, b := range aligned.Plan.Buckets {
		l := int32(2 - k)
		if b.Bytes != 4_004_000 || b.Piece != int(l) || !reflect.DeepEqual(b.Params, []int32{2*l + 1, 2 * l}) {
			t.Errorf("aligned bucket %d = %+v, want layer %d's bias and weight, 4004000 bytes", k, b, l)
		}
	}
	if aligned.Plan.Fingerprint == plain.Plan.Fingerprint {
		t.Error("align_buckets does not change the fingerprint")
	}
	cfg.Mode = int32(planner.ModeTorch)
	if res := callPlanGraph(toyGraph(1000), cfg, false); res.Status != statusInvalidConfig || !strings.Contains(res.Msg, "AlignBuckets") {
		t.Errorf("torch mode with align_buckets: %d %q", res.Status, res.Msg)
	}
}

// equalLists compares lists of lists treating nil and empty alike: the C
// plan cannot tell them apart.
func equalLists(a, b [][]int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if a[i][j] != b[i][j] {
				return false
			}
		}
	}
	return true
}

// TestConcurrentCalls plans from several goroutines at once (run with -race):
// all must agree.
func TestConcurrentCalls(t *testing.T) {
	const workers = 8
	results := make([]planCall, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = callPlanGraph(toyGraph(1000), toyConfig(planner.ModeDDP), false)
		}()
	}
	wg.Wait()
	for i := 1; i < workers; i++ {
		if !reflect.DeepEqual(results[i], results[0]) {
			t.Errorf("worker %d got %+v, worker 0 got %+v", i, results[i], results[0])
		}
	}
}

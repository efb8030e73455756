package planner

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// oracleFile is testdata/torch_oracle/cases.json, written by generate.py
// next to it from the real torch's DDPOptimizer.
type oracleFile struct {
	TorchVersion string       `json:"torch_version"`
	Cases        []oracleCase `json:"cases"`
}

type oracleCase struct {
	Cap      int64 `json:"cap"`
	FirstCap int64 `json:"first_cap"`
	Graph    struct {
		Ops          []OpKind  `json:"ops"`
		ModuleIDs    []int32   `json:"module_ids"`
		ParamOffsets []int64   `json:"param_offsets"`
		ParamIndex   []int32   `json:"param_index"`
		ParamRefs    []RefKind `json:"param_refs"`
		UserOffsets  []int64   `json:"user_offsets"`
		Users        []int32   `json:"users"`
		Params       []struct {
			Name         string `json:"name"`
			Bytes        int64  `json:"bytes"`
			StorageBytes int64  `json:"storage_bytes"`
			RequiresGrad bool   `json:"requires_grad"`
			Ignored      bool   `json:"ignored"`
		} `json:"params"`
	} `json:"graph"`
	Want struct {
		NodePieces []int32 `json:"node_pieces"`
		Buckets    []struct {
			Bytes    int64   `json:"bytes"`
			Params   []int32 `json:"params"`
			Extended bool    `json:"extended"`
		} `json:"buckets"`
	} `json:"want"`
}

// TestTorchOracle replans graphs whose buckets the real torch DDPOptimizer
// chose and expects ModeTorch to agree on every piece, bucket size,
// parameter list and extension.
func TestTorchOracle(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "torch_oracle", "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file oracleFile
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Cases) < 100 {
		t.Fatalf("only %d oracle cases", len(file.Cases))
	}
	t.Logf("%d cases from torch %s", len(file.Cases), file.TorchVersion)
	multiPiece, extended := 0, 0
	for k, c := range file.Cases {
		g := &Graph{
			Ops: c.Graph.Ops, ModuleIDs: c.Graph.ModuleIDs,
			ParamOffsets: c.Graph.ParamOffsets, ParamIndex: c.Graph.ParamIndex, ParamRefs: c.Graph.ParamRefs,
			UserOffsets: c.Graph.UserOffsets, Users: c.Graph.Users,
		}
		for _, p := range c.Graph.Params {
			g.Params = append(g.Params, Param{Name: p.Name, Bytes: p.Bytes, StorageBytes: p.StorageBytes,
				RequiresGrad: p.RequiresGrad, Ignored: p.Ignored})
		}
		cfg := torchCfg(c.Cap, c.FirstCap)
		pl, err := Build(g, cfg)
		if err != nil {
			t.Errorf("case %d: %v", k, err)
			continue
		}
		if pl.NumPartitions > 1 {
			multiPiece++
		}
		for _, b := range pl.Buckets {
			if b.Extended {
				extended++
				break
			}
		}
		if !slices.Equal(pl.NodePartition, c.Want.NodePieces) {
			t.Errorf("case %d: pieces %v, torch %v", k, pl.NodePartition, c.Want.NodePieces)
		}
		if len(pl.Buckets) != len(c.Want.Buckets) {
			t.Errorf("case %d: %d buckets, torch %d", k, len(pl.Buckets), len(c.Want.Buckets))
			continue
		}
		for j, want := range c.Want.Buckets {
			got := pl.Buckets[j]
			if got.Bytes != want.Bytes || got.Extended != want.Extended || !slices.Equal(got.Params, want.Params) {
				t.Errorf("case %d bucket %d: %d bytes, extended %t, params %v; torch %d, %t, %v",
					k, j, got.Bytes, got.Extended, got.Params, want.Bytes, want.Extended, want.Params)
			}
		}
	}
	t.Logf("%d cases with several pieces, %d with an extended bucket", multiPiece, extended)
	if multiPiece < len(file.Cases)/2 {
		t.Errorf("only %d of %d cases have several pieces: the cases exercise too little", multiPiece, len(file.Cases))
	}
	if extended < 10 {
		t.Errorf("only %d cases extend a bucket: the cases exercise too little", extended)
	}
}

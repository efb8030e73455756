package planner

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// record is a plan record of module with buckets of the given bytes.
func record(fp any, module string, bytes ...int64) PlanRecord {
	rec := PlanRecord{Mode: json.RawMessage(`"ddp"`)}
	rec.Fingerprint, _ = json.Marshal(fp)
	rec.DDPModule, _ = json.Marshal(map[string]any{"key": module, "type": "M"})
	var bs []map[string]any
	for _, b := range bytes {
		bs = append(bs, map[string]any{"bytes": b, "param_names": []string{fmt.Sprint("p", b)}})
	}
	rec.Buckets, _ = json.Marshal(bs)
	return rec
}

func plansJSON(t *testing.T, plans []TracedPlan) string {
	out, err := json.Marshal(plans)
	require.NoError(t, err)
	return string(out)
}

// TestTracePlansOf: the selection (module, buckets, one per fingerprint,
// latest wins and moves last) and the projection.
func TestTracePlansOf(t *testing.T) {
	recs := []PlanRecord{
		record(1, "M#0", 8), record(2, "M#1", 8), record(3, "M#0"), record(nil, "M#0", 4),
		record(1, "M#0", 16, 32), record(uint64(1<<63), "M#0", 2), {Fingerprint: json.RawMessage("5")},
	}
	got, err := TracePlansOf("M#0", recs)
	require.NoError(t, err)
	assert.JSONEq(t, `[
	 {"fingerprint": null, "mode": "ddp", "num_pieces": null, "bucket_bytes": [4], "bucket_param_names": [["p4"]],
	  "ddp_buckets": null, "fallback": null, "ddp_module": {"key": "M#0", "type": "M"}, "forward": null},
	 {"fingerprint": "0000000000000001", "mode": "ddp", "num_pieces": null, "bucket_bytes": [16, 32], "bucket_param_names": [["p16"], ["p32"]],
	  "ddp_buckets": null, "fallback": null, "ddp_module": {"key": "M#0", "type": "M"}, "forward": null},
	 {"fingerprint": "8000000000000000", "mode": "ddp", "num_pieces": null, "bucket_bytes": [2], "bucket_param_names": [["p2"]],
	  "ddp_buckets": null, "fallback": null, "ddp_module": {"key": "M#0", "type": "M"}, "forward": null}]`, plansJSON(t, got))
	got, err = TracePlansOf("nobody", recs)
	require.NoError(t, err)
	assert.Equal(t, "[]", plansJSON(t, got))
}

// TestTracePlansOfRejects: a selected record with buckets the trace cannot
// read; the same record of another module is never read.
func TestTracePlansOfRejects(t *testing.T) {
	for _, tc := range []struct{ buckets, module, want string }{
		{`[{"param_names": []}]`, `{"key": "M"}`, `bucket 0 has no "bytes"`},
		{`[{"bytes": 1, "param_names": null}]`, `{"key": "M"}`, `"param_names" is not a list`},
		{`{"a": 1}`, `{"key": "M"}`, `"buckets" is not a list`},
		{`[{"bytes": 1}]`, `["M"]`, `"ddp_module" is not an object`},
	} {
		rec := PlanRecord{Buckets: json.RawMessage(tc.buckets), DDPModule: json.RawMessage(tc.module)}
		_, err := TracePlansOf("M", []PlanRecord{rec})
		require.ErrorContains(t, err, tc.want)
		assert.Equal(t, ErrInvalidConfig, err.(*Error).Code)
		if tc.module != `["M"]` {
			rec.DDPModule = json.RawMessage(`{"key": "N"}`)
			_, err = TracePlansOf("M", []PlanRecord{rec})
			assert.NoError(t, err)
		}
	}
}

// FuzzTracePlansOf: against the obvious reference, an ordered map that
// deletes a fingerprint's entry and appends it again.
func FuzzTracePlansOf(f *testing.F) {
	f.Add(uint64(1), uint8(6))
	f.Add(uint64(9), uint8(0))
	f.Fuzz(func(t *testing.T, seed uint64, n uint8) {
		rng := rand.New(rand.NewPCG(seed, 5))
		modules := []string{"A#0", "A#1"}
		var recs []PlanRecord
		type entry struct {
			key   string
			bytes []int64
		}
		var want []entry
		for i := 0; i < int(n%12); i++ {
			fp := []any{nil, 1, 2, 3}[rng.IntN(4)]
			mod := modules[rng.IntN(2)]
			bytes := make([]int64, rng.IntN(3))
			for k := range bytes {
				bytes[k] = rng.Int64N(100)
			}
			recs = append(recs, record(fp, mod, bytes...))
			if mod != "A#0" || len(bytes) == 0 {
				continue
			}
			key := fmt.Sprint(fp)
			want = slices.DeleteFunc(want, func(e entry) bool { return e.key == key })
			want = append(want, entry{key, bytes})
		}
		got, err := TracePlansOf("A#0", recs)
		require.NoError(t, err)
		require.Len(t, got, len(want))
		for i, e := range want {
			var bs []int64
			for _, b := range got[i].BucketBytes {
				var x int64
				require.NoError(t, json.Unmarshal(b, &x))
				bs = append(bs, x)
			}
			assert.Equal(t, e.bytes, bs)
			if e.key == "<nil>" {
				assert.Nil(t, got[i].Fingerprint)
			} else {
				assert.Equal(t, fmt.Sprintf("%016s", e.key), *got[i].Fingerprint)
			}
		}
	})
}

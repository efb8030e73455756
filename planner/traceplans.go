package planner

import (
	"encoding/json"
	"fmt"
)

// Note [A trace's plans]
//
// A trace record lists the goddp plans of its DDP module's graphs: the
// plan records (goddp.last_plans()) whose "ddp_module" key is the
// module's, one per fingerprint (the latest record of a fingerprint wins
// and takes its place, so the list stays oldest first), and only records
// with buckets (a graph without DDP's parameters has none). Each is
// projected to what the trace shows: the fingerprint as 16 hex digits
// (null when planning failed), the buckets' bytes and parameter names, and
// mode, num_pieces, ddp_buckets, fallback, ddp_module and forward as the
// record has them (null where absent). The shim hands over the records
// and the module's key; it cannot know the key's records without torch.

// PlanRecord is a plan record as TracePlansOf reads it: the fields it
// selects by and projects, the others ignored. Raw fields pass through
// verbatim (absent: nil, written as null).
type PlanRecord struct {
	Fingerprint json.RawMessage `json:"fingerprint"`
	Buckets     json.RawMessage `json:"buckets"`
	DDPModule   json.RawMessage `json:"ddp_module"`
	Mode        json.RawMessage `json:"mode"`
	NumPieces   json.RawMessage `json:"num_pieces"`
	DDPBuckets  json.RawMessage `json:"ddp_buckets"`
	Fallback    json.RawMessage `json:"fallback"`
	Forward     json.RawMessage `json:"forward"`
}

// TracedPlan is one plan of a trace record (the record's "goddp_plans"
// entry; TracePlan reads it back).
type TracedPlan struct {
	Fingerprint      *string           `json:"fingerprint"`
	Mode             json.RawMessage   `json:"mode"`
	NumPieces        json.RawMessage   `json:"num_pieces"`
	BucketBytes      []json.RawMessage `json:"bucket_bytes"`
	BucketParamNames []json.RawMessage `json:"bucket_param_names"`
	DDPBuckets       json.RawMessage   `json:"ddp_buckets"`
	Fallback         json.RawMessage   `json:"fallback"`
	DDPModule        json.RawMessage   `json:"ddp_module"`
	Forward          json.RawMessage   `json:"forward"`
}

// TracePlansOf selects and projects module's plans from records, oldest
// first (Note [A trace's plans]). It fails for a selected record whose
// buckets are not a list of objects with "bytes", or whose bucket's
// "param_names" is present and not a list.
func TracePlansOf(module string, records []PlanRecord) ([]TracedPlan, error) {
	var plans []TracedPlan
	var keys []string // each plan's fingerprint, as the record writes it
	last := map[string]int{}
	for i := range records {
		buckets, ok, err := records[i].selectedBuckets(module)
		if err != nil {
			return nil, errorf(ErrInvalidConfig, "planner: plan record %d: %v", i, err)
		}
		if !ok {
			continue
		}
		p, err := records[i].project(buckets)
		if err != nil {
			return nil, errorf(ErrInvalidConfig, "planner: plan record %d: %v", i, err)
		}
		key := string(rawOrNull(records[i].Fingerprint))
		last[key] = len(plans)
		plans, keys = append(plans, *p), append(keys, key)
	}
	out := []TracedPlan{}
	for i, p := range plans {
		if last[keys[i]] == i {
			out = append(out, p)
		}
	}
	return out, nil
}

// project is a selected record's plan.
func (rec *PlanRecord) project(buckets []recordBucket) (*TracedPlan, error) {
	p := &TracedPlan{Mode: rawOrNull(rec.Mode), NumPieces: rawOrNull(rec.NumPieces), DDPBuckets: rawOrNull(rec.DDPBuckets),
		Fallback: rawOrNull(rec.Fallback), DDPModule: rawOrNull(rec.DDPModule), Forward: rawOrNull(rec.Forward),
		BucketBytes: make([]json.RawMessage, len(buckets)), BucketParamNames: make([]json.RawMessage, len(buckets))}
	var fp *uint64 // nil for null; an integer only, as Python's isinstance(f, int)
	if json.Unmarshal(rec.Fingerprint, &fp) == nil && fp != nil {
		p.Fingerprint = ptr(fmt.Sprintf("%016x", *fp))
	}
	for k, b := range buckets {
		if b.Bytes == nil {
			return nil, fmt.Errorf("bucket %d has no \"bytes\"", k)
		}
		p.BucketBytes[k], p.BucketParamNames[k] = b.Bytes, json.RawMessage("[]")
		if b.ParamNames != nil {
			var names []json.RawMessage
			if err := json.Unmarshal(b.ParamNames, &names); err != nil || names == nil {
				return nil, fmt.Errorf("bucket %d's \"param_names\" is not a list", k)
			}
			p.BucketParamNames[k] = b.ParamNames
		}
	}
	return p, nil
}

type recordBucket struct {
	Bytes      json.RawMessage `json:"bytes"`
	ParamNames json.RawMessage `json:"param_names"`
}

// selectedBuckets are the record's buckets when it is one of module's
// with buckets; false otherwise.
func (rec *PlanRecord) selectedBuckets(module string) ([]recordBucket, bool, error) {
	if isNullish(rec.Buckets) {
		return nil, false, nil
	}
	var owner struct {
		Key any `json:"key"`
	}
	if !isNullish(rec.DDPModule) {
		if err := json.Unmarshal(rec.DDPModule, &owner); err != nil {
			return nil, false, fmt.Errorf("\"ddp_module\" is not an object")
		}
	}
	if key, ok := owner.Key.(string); !ok || key != module {
		return nil, false, nil
	}
	var buckets []recordBucket
	if err := json.Unmarshal(rec.Buckets, &buckets); err != nil {
		return nil, false, fmt.Errorf("\"buckets\" is not a list of objects")
	}
	return buckets, true, nil
}

// isNullish: absent, null, or an empty list or object (what Python's
// truth test rejects of a list or dict field).
func isNullish(raw json.RawMessage) bool {
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil {
		return len(raw) == 0
	}
	switch v := v.(type) {
	case nil:
		return true
	case []any:
		return len(v) == 0
	case map[string]any:
		return len(v) == 0
	}
	return false
}

func rawOrNull(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

package main

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"

// See exports.go: cgo cannot spell const in an export's signature.
typedef const char goddp_text_in;
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/goddp/goddp/planner"
)

// Note [Agreement as JSON]: the statements of an agreement round are
// nested, optional and few (one per rank, once or twice per DDP module), and
// they already cross the c10d store as JSON text; so goddp_agree takes and
// returns JSON text rather than flat arrays. goddp.h and docs/planner.md
// ("Agreement") document both shapes; the types below are them.

// wireLayout is python/goddp/ranks/layout.py's Layout.to_dict.
type wireLayout struct {
	Buckets [][]int32 `json:"buckets"`
	Caps    []int64   `json:"caps"`
	Order   string    `json:"order"`
	Build   string    `json:"build"`
}

// wireStatement is python/goddp/ranks/plan_check.py's Statement.to_json.
type wireStatement struct {
	Layout      *wireLayout `json:"layout"`
	Digest      *hex64      `json:"digest"`
	Reason      *string     `json:"reason"`
	Later       bool        `json:"later"`
	Strict      bool        `json:"strict"`
	Lost        *string     `json:"lost"`
	Fingerprint *hex64      `json:"fingerprint"`
	Pieces      *int        `json:"pieces"`
}

type wireInstalled struct {
	Failed *string `json:"failed"`
	Lost   *string `json:"lost"`
}

type wireRequest struct {
	Statements map[string]wireStatement `json:"statements"`
	Names      map[string]string        `json:"names"`
	MayDefer   bool                     `json:"may_defer"`
	Installed  map[string]wireInstalled `json:"installed"`
	Unsettled  *wireUnsettled           `json:"unsettled"`
	Group      *wireGroup               `json:"group"`
}

type wireGroup struct {
	Name string `json:"name"`
	Size int    `json:"size"`
}

type wireUnsettled struct {
	StoppedBy int   `json:"stopped_by"`
	Missing   []int `json:"missing"`
}

type wireRank struct {
	Rank         int     `json:"rank"`
	Fingerprint  *hex64  `json:"fingerprint"`
	Pieces       int     `json:"pieces"`
	LayoutDigest *hex64  `json:"layout_digest"`
	Caps         []int64 `json:"caps"`
	Reason       *string `json:"reason"`
	Later        bool    `json:"later"`
}

type wireRecord struct {
	Aligned      bool       `json:"aligned"`
	Action       string     `json:"action"`
	Caps         []int64    `json:"caps"`
	LayoutDigest *hex64     `json:"layout_digest"`
	Reason       *string    `json:"reason"`
	Ranks        []wireRank `json:"ranks"`
}

type wireVerdict struct {
	Error      *string     `json:"error"`
	Message    *string     `json:"message"`
	Action     *string     `json:"action"`
	LayoutRank *int        `json:"layout_rank"`
	Reason     *string     `json:"reason"`
	Disagreed  bool        `json:"disagreed"`
	Record     *wireRecord `json:"record"`
	Log        *wireLog    `json:"log,omitempty"`
}

// hex64 is a 64-bit digest or fingerprint as 16 hex digits.
type hex64 uint64

func (h hex64) MarshalJSON() ([]byte, error) {
	return json.Marshal(fmt.Sprintf("%016x", uint64(h)))
}

func (h *hex64) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return fmt.Errorf("%q is not a 64-bit hex number", s)
	}
	*h = hex64(v)
	return nil
}

//export goddp_agree
func goddp_agree(request *C.goddp_text_in, verdict **C.char, errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	return answer("goddp_agree", request, verdict, errMsg, func(text string) (any, error) {
		req, err := agreeRequestFromJSON(text)
		if err != nil {
			return nil, err
		}
		v, err := planner.Agree(req)
		if err != nil {
			return nil, err
		}
		return verdictToWire(v), nil
	})
}

// agreeRequestFromJSON converts the request text into the planner's types.
func agreeRequestFromJSON(text string) (*planner.AgreeRequest, error) {
	var w wireRequest
	if err := json.Unmarshal([]byte(text), &w); err != nil {
		return nil, invalidConfig("goddp: goddp_agree: the request is not valid JSON: %v", err)
	}
	req := &planner.AgreeRequest{MayDefer: w.MayDefer, Names: make(map[int32]string, len(w.Names))}
	for key, name := range w.Names {
		p, err := strconv.ParseInt(key, 10, 32)
		if err != nil || strconv.FormatInt(p, 10) != key {
			return nil, invalidConfig("goddp: goddp_agree: names key %q is not a DDP position in decimal", key)
		}
		req.Names[int32(p)] = name
	}
	for key, ws := range w.Statements {
		rank, err := rankKey("statements", key)
		if err != nil {
			return nil, err
		}
		s, err := statementFromWire(rank, &ws)
		if err != nil {
			return nil, err
		}
		req.Statements = append(req.Statements, s)
	}
	if w.Group != nil {
		req.Group = &planner.AgreeGroup{Name: w.Group.Name, Size: w.Group.Size}
	}
	if w.Unsettled != nil {
		req.Unsettled = &planner.Unsettled{StoppedBy: w.Unsettled.StoppedBy, Missing: w.Unsettled.Missing}
	}
	if w.Installed != nil {
		req.Installed = make(map[int]planner.InstallReport, len(w.Installed))
		for key, wi := range w.Installed {
			rank, err := rankKey("installed", key)
			if err != nil {
				return nil, err
			}
			req.Installed[rank] = planner.InstallReport{Failed: deref(wi.Failed), Lost: deref(wi.Lost)}
		}
	}
	return req, nil
}

// rankKey is the rank a key names, written as strconv.Itoa writes it: "00"
// or "+1" would name a rank twice in one JSON object, and which one won
// would then depend on Go's map order. (Agree refuses negative ranks.)
func rankKey(field, key string) (int, error) {
	rank, err := strconv.Atoi(key)
	if err != nil || strconv.Itoa(rank) != key {
		return 0, invalidConfig("goddp: goddp_agree: %s key %q is not a rank in decimal", field, key)
	}
	return rank, nil
}

func statementFromWire(rank int, w *wireStatement) (planner.Statement, error) {
	s := planner.Statement{
		Rank: rank, Reason: w.Reason, Later: w.Later, Strict: w.Strict, Lost: w.Lost,
		Digest: (*uint64)(w.Digest), Fingerprint: (*uint64)(w.Fingerprint), Pieces: 1,
	}
	if w.Pieces != nil {
		s.Pieces = *w.Pieces
	}
	if w.Layout != nil {
		l, ok := layoutFromWire(w.Layout)
		if !ok {
			return s, invalidConfig("goddp: goddp_agree: rank %d: layout order %q; want \"ready\" or \"declaration\"", rank, w.Layout.Order)
		}
		s.Layout = l
	}
	return s, nil
}

func verdictToWire(v *planner.Verdict) *wireVerdict {
	if v.Error != planner.ErrorNone {
		name := v.Error.String()
		return &wireVerdict{Error: &name, Message: &v.Message}
	}
	action := v.Action.String()
	w := &wireVerdict{Action: &action, Reason: v.Reason, Disagreed: v.Disagreed}
	if v.LayoutRank >= 0 {
		w.LayoutRank = &v.LayoutRank
	}
	w.Log = logToWire(v.Log)
	r := &v.Record
	w.Record = &wireRecord{
		Aligned: r.Aligned, Action: r.Action.String(), Caps: r.Caps, LayoutDigest: (*hex64)(r.LayoutDigest),
		Reason: r.Reason, Ranks: make([]wireRank, len(r.Ranks)),
	}
	for i, rr := range r.Ranks {
		w.Record.Ranks[i] = wireRank{
			Rank: rr.Rank, Fingerprint: (*hex64)(rr.Fingerprint), Pieces: rr.Pieces,
			LayoutDigest: (*hex64)(rr.LayoutDigest), Caps: rr.Caps, Reason: rr.Reason, Later: rr.Later,
		}
	}
	return w
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

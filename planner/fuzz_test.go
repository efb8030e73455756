package planner

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// byteSource hands out the fuzzer's bytes as small numbers; past the end it
// yields zeros, so every input decodes to something.
type byteSource struct {
	data []byte
	pos  int
}

func (s *byteSource) next() byte {
	if s.pos >= len(s.data) {
		return 0
	}
	s.pos++
	return s.data[s.pos-1]
}

// intn returns a number in [0, n) for 0 < n <= 65536.
func (s *byteSource) intn(n int) int {
	v := int(s.next())
	if n > 256 {
		v = v<<8 | int(s.next())
	}
	return v % n
}

// chance is true with probability about k/256.
func (s *byteSource) chance(k int) bool { return int(s.next()) < k }

var fuzzParamSizes = []int64{0, 1, 3, 8, 17, 40, 100, 250}

// decodeFuzzInput turns arbitrary bytes into a graph and a config. Most
// inputs give well-formed graphs of up to ~45 nodes with small caps, so that
// plans have many buckets, extensions and merges. The first byte chooses:
// bit 0 the mode, bit 1 AlignBuckets (in either mode: ModeTorch must refuse
// it), bit 2, when aligning, to keep the parameters' mixed dtypes and
// devices (which AlignBuckets must refuse) rather than give them all one,
// and bit 7 one corruption afterwards, to exercise validation.
func decodeFuzzInput(data []byte) (*Graph, Config) {
	s := &byteSource{data: data}
	header := s.next()

	b := &graphBuilder{}
	numParams := s.intn(9)
	for p := range numParams {
		bytes := fuzzParamSizes[s.intn(len(fuzzParamSizes))]
		var opts []paramOpt
		if s.chance(40) {
			opts = append(opts, storage(bytes*2)) // a view into a larger storage
		}
		if s.chance(25) {
			opts = append(opts, frozen)
		}
		if s.chance(20) {
			opts = append(opts, ignored)
		}
		if s.chance(40) {
			opts = append(opts, dtype(int32(1+s.intn(2))))
		}
		b.param(string(rune('a'+p)), bytes, opts...)
		if s.chance(20) {
			b.params[p].Device = 1
		}
	}

	placeholders := s.intn(4)
	for range placeholders {
		b.placeholder("p")
	}
	compute := s.intn(40)
	for range compute {
		if s.chance(12) {
			b.placeholder("late")
			continue
		}
		op, mod := OpCallFunction, int32(-1)
		switch s.intn(8) {
		case 0:
			op, mod = OpCallModule, int32(s.intn(4))
		case 1:
			op = OpCallMethod
			if s.chance(128) {
				mod = int32(s.intn(4))
			}
		case 2:
			op = OpGetAttr
		}
		var refs []paramRef
		if numParams > 0 {
			for range s.intn(4) {
				kind := RefKind(s.intn(4))
				if kind == RefModule && mod < 0 && (op == OpCallModule || op == OpCallMethod) {
					kind = RefArg
				}
				refs = append(refs, paramRef{int32(s.intn(numParams)), kind})
			}
		}
		b.node("n", op, mod, nil, refs...)
	}
	out := b.output()

	// Edges: each node gets up to three users among later non-placeholder
	// nodes, sometimes the output node.
	for i := range out {
		for range s.intn(4) {
			u := i + 1 + s.intn(out-i)
			if b.ops[u] == OpPlaceholder {
				u = out
			}
			b.users[i] = append(b.users[i], int32(u))
		}
	}
	g := b.graph()

	align := header&2 != 0
	if align && header&4 == 0 {
		for p := range g.Params {
			g.Params[p].DType, g.Params[p].Device = 0, 0
		}
	}
	cfg := Config{Mode: Mode(header & 1), AlignBuckets: align}
	cfg.BucketCapBytes = int64(1 + s.intn(300))
	cfg.FirstBucketCapBytes = int64(1 + s.intn(int(cfg.BucketCapBytes)))
	if cfg.Mode == ModeDDP {
		for range s.intn(4) - 1 {
			cfg.BucketCapsBytes = append(cfg.BucketCapsBytes, int64(1+s.intn(300)))
		}
		if s.chance(80) {
			cfg.MaxPieces = 1 + s.intn(5)
		}
	}
	if header&0x80 != 0 {
		corrupt(s, g, &cfg)
	}
	return g, cfg
}

// corrupt changes one field of g or cfg to an arbitrary value.
func corrupt(s *byteSource, g *Graph, cfg *Config) {
	n := len(g.Ops)
	anyValue := func() int64 { return int64(int8(s.next())) }
	switch s.intn(12) {
	case 0:
		g.Ops[s.intn(n)] = OpKind(anyValue())
	case 1:
		g.ModuleIDs[s.intn(n)] = int32(anyValue())
	case 2:
		g.ParamOffsets[s.intn(n+1)] = anyValue()
	case 3:
		g.UserOffsets[s.intn(n+1)] = anyValue()
	case 4:
		if len(g.ParamIndex) > 0 {
			g.ParamIndex[s.intn(len(g.ParamIndex))] = int32(anyValue())
		}
	case 5:
		if len(g.ParamRefs) > 0 {
			g.ParamRefs[s.intn(len(g.ParamRefs))] = RefKind(s.next())
		}
	case 6:
		if len(g.Users) > 0 {
			g.Users[s.intn(len(g.Users))] = int32(anyValue())
		}
	case 7:
		if len(g.Params) > 0 {
			g.Params[s.intn(len(g.Params))].Bytes = anyValue()
		}
	case 8:
		cfg.BucketCapBytes = anyValue()
	case 9:
		cfg.FirstBucketCapBytes = anyValue()
	case 10:
		cfg.MaxPieces = int(anyValue())
		cfg.BucketCapsBytes = append(cfg.BucketCapsBytes, anyValue())
	case 11:
		cfg.Mode = Mode(anyValue())
	}
}

// checkBuild plans g under cfg and checks the outcome: a valid plan that
// matches the reference implementations and replans identically, or an
// *Error with a known code and a message.
func checkBuild(t *testing.T, g *Graph, cfg Config) {
	t.Helper()
	pl, err := Build(g, cfg)
	if err != nil {
		var perr *Error
		if !errors.As(err, &perr) {
			t.Fatalf("error %T %q is not *Error", err, err)
		}
		if perr.Code < ErrInvalidConfig || perr.Code > ErrOverflow || perr.Msg == "" {
			t.Fatalf("bad error: code %d message %q", perr.Code, perr.Msg)
		}
		if pl != nil {
			t.Fatalf("plan returned alongside an error")
		}
		if cfg.AlignBuckets {
			checkAlignRefusal(t, g, cfg, perr)
		}
		return
	}
	if cfg.AlignBuckets && cfg.Mode == ModeTorch {
		t.Fatalf("ModeTorch accepted AlignBuckets")
	}
	for _, v := range checkPlan(g, cfg, pl) {
		t.Error(v)
	}
	if err := buildTwiceSame(g, cfg, pl); err != nil {
		t.Error(err)
	}
}

// checkAlignRefusal: when Build refuses an AlignBuckets config that it
// accepts without alignment, the reason must be ModeTorch, reported as
// ErrInvalidConfig.
func checkAlignRefusal(t *testing.T, g *Graph, cfg Config, perr *Error) {
	t.Helper()
	plain := cfg
	plain.AlignBuckets = false
	if _, err := Build(g, plain); err != nil {
		return // refused for another reason
	}
	if perr.Code != ErrInvalidConfig || cfg.Mode != ModeTorch {
		t.Fatalf("AlignBuckets refused with code %d (%q) in mode %d", perr.Code, perr.Msg, cfg.Mode)
	}
}

func FuzzPlan(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0x00, 8, 100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte{0x01, 8, 200, 100, 50, 30, 255, 7, 3, 39, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9})
	f.Add([]byte{0x81, 4, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21})
	f.Add([]byte{0x02, 8, 100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte{0x06, 8, 200, 100, 50, 30, 255, 7, 3, 39, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9})
	addRandomSeeds(f, rand.New(rand.NewPCG(1, 2)))
	f.Fuzz(func(t *testing.T, data []byte) {
		g, cfg := decodeFuzzInput(data)
		checkBuild(t, g, cfg)
	})
}

// TestRandomGraphs runs the fuzz decoder over a fixed stream of random
// inputs on every test run, so the comparison with the reference
// implementations covers thousands of shapes without the fuzzer.
func TestRandomGraphs(t *testing.T) {
	forRandomFuzzInputs(t, rand.New(rand.NewPCG(20240611, 7)), 4000, 500, func(data []byte) {
		g, cfg := decodeFuzzInput(data)
		checkBuild(t, g, cfg)
	})
}

// addRandomSeeds adds 8 random 200-byte inputs drawn from rng to f's corpus.
func addRandomSeeds(f *testing.F, rng *rand.Rand) {
	for range 8 {
		seed := make([]byte, 200)
		for k := range seed {
			seed[k] = byte(rng.Uint32())
		}
		f.Add(seed)
	}
}

// forRandomFuzzInputs calls check on runs (shortRuns with -short) random
// fuzz inputs drawn from rng, and stops at the first failing one, printing
// it so that it can be added to the fuzz corpus.
func forRandomFuzzInputs(t *testing.T, rng *rand.Rand, runs, shortRuns int, check func(data []byte)) {
	t.Helper()
	if testing.Short() {
		runs = shortRuns
	}
	data := make([]byte, 400)
	for range runs {
		for k := range data {
			data[k] = byte(rng.Uint32())
		}
		check(data)
		if t.Failed() {
			t.Fatalf("failing input: %x", data)
		}
	}
}

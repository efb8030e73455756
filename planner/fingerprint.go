package planner

import (
	"encoding/binary"
	"hash"
	"hash/fnv"
)

// fingerprintVersion changes whenever the encoding below changes, so that
// ranks running different goddp builds never agree by accident.
const fingerprintVersion = 2

// fingerprint hashes the inputs and the result of a plan with 64-bit FNV-1a
// over a canonical little-endian encoding: every integer at a fixed width,
// every list preceded by its length, every name by its byte length. Equal
// inputs and plans give equal fingerprints on any machine and in any
// process; ranks compare them before the first collective.
func fingerprint(g *Graph, cfg *Config, pl *Plan) uint64 {
	e := encoder{h: fnv.New64a()}
	e.u64(fingerprintVersion)

	e.i64(int64(cfg.Mode))
	e.i64(cfg.BucketCapBytes)
	e.i64(cfg.FirstBucketCapBytes)
	e.i64(int64(len(cfg.BucketCapsBytes)))
	for _, c := range cfg.BucketCapsBytes {
		e.i64(c)
	}
	e.i64(int64(cfg.MaxPieces))
	e.bool(cfg.AlignBuckets)
	if cfg.BucketOrder != OrderReady {
		// Encoded only when set, so that ready-order plans keep their
		// fingerprints (and golden files) from before the field existed.
		e.i32(int32(cfg.BucketOrder))
		for p := range g.Params {
			e.i32(g.Params[p].DDPPosition)
		}
	}

	e.i64(int64(len(g.Ops)))
	for _, op := range g.Ops {
		e.i32(int32(op))
	}
	for _, id := range g.ModuleIDs {
		e.i32(id)
	}
	for _, off := range g.ParamOffsets {
		e.i64(off)
	}
	for k, p := range g.ParamIndex {
		e.i32(p)
		e.u8(uint8(g.ParamRefs[k]))
	}
	for _, off := range g.UserOffsets {
		e.i64(off)
	}
	for _, u := range g.Users {
		e.i32(u)
	}
	// Block ids only when given, so that plans without them keep their
	// fingerprints; nil and a slice of -1 differ, but every rank exports the
	// same form.
	if g.BlockIDs != nil {
		e.i64(int64(len(g.BlockIDs)))
		for _, id := range g.BlockIDs {
			e.i32(id)
		}
	}
	e.i64(int64(len(g.Params)))
	for p := range g.Params {
		prm := &g.Params[p]
		e.i64(int64(len(prm.Name)))
		e.str(prm.Name)
		e.i64(prm.Bytes)
		e.i64(prm.StorageBytes)
		e.i32(prm.DType)
		e.i32(prm.Device)
		e.bool(prm.RequiresGrad)
		e.bool(prm.Ignored)
	}

	for _, piece := range pl.NodePiece {
		e.i32(piece)
	}
	e.i64(int64(pl.NumPieces))
	e.i64(int64(len(pl.Buckets)))
	for k := range pl.Buckets {
		b := &pl.Buckets[k]
		e.i64(b.Bytes)
		e.i64(int64(len(b.Params)))
		for _, p := range b.Params {
			e.i32(p)
		}
		e.i64(int64(b.NodeBegin))
		e.i64(int64(b.NodeEnd))
		e.i64(int64(b.Piece))
		e.bool(b.Extended)
		e.i32(b.DType)
		e.i32(b.Device)
	}
	return e.sum()
}

// encoder batches the encoding into a fixed buffer so that the hash sees a
// few large writes rather than one call per value.
type encoder struct {
	h   hash.Hash64
	buf [4096]byte
	n   int
}

func (e *encoder) room(k int) {
	if e.n+k > len(e.buf) {
		e.flush()
	}
}

func (e *encoder) flush() {
	e.h.Write(e.buf[:e.n]) // hash.Hash never returns an error
	e.n = 0
}

func (e *encoder) u8(v uint8) {
	e.room(1)
	e.buf[e.n] = v
	e.n++
}

func (e *encoder) bool(v bool) {
	if v {
		e.u8(1)
	} else {
		e.u8(0)
	}
}

func (e *encoder) i32(v int32) {
	e.room(4)
	binary.LittleEndian.PutUint32(e.buf[e.n:], uint32(v))
	e.n += 4
}

func (e *encoder) i64(v int64) { e.u64(uint64(v)) }

func (e *encoder) u64(v uint64) {
	e.room(8)
	binary.LittleEndian.PutUint64(e.buf[e.n:], v)
	e.n += 8
}

func (e *encoder) str(s string) {
	for len(s) > 0 {
		if e.n == len(e.buf) {
			e.flush()
		}
		c := copy(e.buf[e.n:], s)
		e.n += c
		s = s[c:]
	}
}

func (e *encoder) sum() uint64 {
	e.flush()
	return e.h.Sum64()
}

package planner

import (
	"hash/fnv"
)

// layoutVersion is hashed first into every layout digest; bump it when the
// encoding below changes, so that two builds never compare digests of
// different encodings as equal.
const layoutVersion = 1

// Layout is what DDP will communicate for one module once goddp has set its
// buckets: the one thing the ranks of a DDP module must agree on before any
// of them changes DDP's buckets (python/goddp/ranks/agreement.py, Note
// [Agreeing on DDP's layout]). It says nothing about the graphs it came
// from: ranks whose graphs differ in shapes or history agree when their
// layouts do.
type Layout struct {
	// Buckets in DDP order (bucket 0 is reduced first).
	Buckets []LayoutBucket
	// Caps are the per-bucket caps handed to DDP, in the order DDP walks
	// them (Plan.DDPCaps: DDP order under OrderReady, forward-first under
	// OrderDeclaration).
	Caps []int64
	// Order is how DDP fills its buckets: rebuilt from gradient-ready order
	// after its first backward, or kept in declaration order.
	Order BucketOrder
	// Build names the goddp build that made the layout (version and ABI):
	// two builds may turn one plan into other caps.
	Build string
}

// LayoutBucket is one of DDP's buckets.
type LayoutBucket struct {
	// Positions are the bucket's parameters as indices into DDP's own
	// parameter list, in the order their gradients become ready.
	Positions []int32
}

// Validate reports ErrInvalidConfig for a layout no DDP module could have:
// no bucket or cap, a negative or repeated position, an empty bucket, a cap
// below one byte, an unknown order.
func (l *Layout) Validate() error {
	if len(l.Buckets) == 0 {
		return errorf(ErrInvalidConfig, "planner: a layout needs at least one bucket")
	}
	if len(l.Caps) == 0 {
		return errorf(ErrInvalidConfig, "planner: a layout needs at least one cap")
	}
	for k, c := range l.Caps {
		if c < 1 {
			return errorf(ErrInvalidConfig, "planner: layout cap %d is %d bytes; want >= 1", k, c)
		}
	}
	if l.Order != OrderReady && l.Order != OrderDeclaration {
		return errorf(ErrInvalidConfig, "planner: layout bucket order %d; want %d (ready) or %d (declaration)", l.Order, OrderReady, OrderDeclaration)
	}
	seen := make(map[int32]int, 64)
	for k := range l.Buckets {
		b := &l.Buckets[k]
		if len(b.Positions) == 0 {
			return errorf(ErrInvalidConfig, "planner: layout bucket %d holds no parameter", k)
		}
		for _, p := range b.Positions {
			if p < 0 {
				return errorf(ErrInvalidConfig, "planner: layout bucket %d holds DDP position %d; want >= 0", k, p)
			}
			if other, dup := seen[p]; dup {
				return errorf(ErrInvalidConfig, "planner: DDP position %d is in layout buckets %d and %d", p, other, k)
			}
			seen[p] = k
		}
	}
	return nil
}

// LayoutDigest is a 64-bit digest of the layout: equal on every process and
// machine for equal layouts, and (up to hash collisions) different when any
// bucket's positions, their order, a cap, the bucket order or the build
// differ. The layout must be valid.
func LayoutDigest(l *Layout) (uint64, error) {
	if err := l.Validate(); err != nil {
		return 0, err
	}
	e := encoder{h: fnv.New64a()}
	e.u64(layoutVersion)
	e.i32(int32(l.Order))
	e.i64(int64(len(l.Build)))
	e.str(l.Build)
	e.i64(int64(len(l.Caps)))
	for _, c := range l.Caps {
		e.i64(c)
	}
	e.i64(int64(len(l.Buckets)))
	for k := range l.Buckets {
		b := &l.Buckets[k]
		e.i64(int64(len(b.Positions)))
		for _, p := range b.Positions {
			e.i32(p)
		}
	}
	return e.sum(), nil
}
